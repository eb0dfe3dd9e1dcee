"""Fixtures of the webhook tests: GitHub's side (signed deliveries posted through the ASGI
handler) and a receiver's (a real local HTTP server that records what it is sent)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator

GITHUB_SECRET = "gh-webhook-secret-Abc123xyz"


@pytest.fixture
def github(settings: Any) -> Any:
    settings.HOOKS_GITHUB_SECRET = GITHUB_SECRET
    settings.HOOKS_GITHUB_BASE_BRANCH = "main"
    settings.HOOKS_GITHUB_ISSUE_LABEL = "annihilation"
    return settings


def signature(body: bytes, secret: str = GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


_counter = iter(range(10**9))


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]


def deliver(
    event: str,
    payload: Any = None,
    *,
    body: bytes | None = None,
    delivery: str | None = None,
    sign: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST a delivery to /hooks/github through the project's ASGI application (what daphne
    serves), as GitHub would."""
    from annihilation.asgi import application

    raw = body if body is not None else json.dumps(payload or {}).encode()
    extra = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or f"d-{time.time_ns()}-{next(_counter)}",
        "X-Hub-Signature-256": signature(raw) if sign is None else sign,
        **(headers or {}),
    }
    encoded = [(k.lower().encode(), v.encode()) for k, v in extra.items()]

    async def post() -> dict[str, Any]:
        communicator = HttpCommunicator(application, "POST", "/hooks/github", raw, encoded)
        answer: dict[str, Any] = await communicator.get_response(timeout=30)
        return answer

    response = async_to_sync(post)()
    return Answer(
        response["status"],
        {k.decode().lower(): v.decode() for k, v in response["headers"]},
        response["body"],
    )


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A webhook receiver: answers `statuses` in turn (then 200), records every request."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    # Called with each request before it is answered (what happens elsewhere meanwhile).
    during: Callable[[Received], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, count: int, timeout: float = 20) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.requests)} requests, not {count}, after {timeout} s")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received = Received(self.path, dict(self.headers.items()), body, time.monotonic())
            if state.during is not None:
                state.during(received)
            with state.lock:
                state.requests.append(received)
                status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# The Celery worker fixtures of the burst manager's tests (a real worker subprocess).
from tests.bursts.conftest import fast_settings, make_worker, step_log  # noqa: E402, F401
