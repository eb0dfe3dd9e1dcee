"""GitHub's deliveries straight from the ASGI server, past Django's middleware stack.

`github_fast_path(app)` wraps the project's HTTP application: a POST to /hooks/github is
answered here (the same service, checks and answers as hooks.views.github, its own request id
and log context); every other request goes to `app`. The middleware the view would pass (sessions,
authentication, CSRF, messages, the login lockout) does nothing for a signed machine-to-machine
POST, and in an asynchronous server each of them costs a hop to the one thread that runs
synchronous code, several times the delivery's own work.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from core.logs import REQUEST_ID_HEADER, log_ids, plain_request_id
from core.metrics import validation_failed
from hooks.errors import WebhookRefused
from hooks.services.github import Received, github_receive

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/hooks/github"


def _receive(request_id: str, **delivery: Any) -> Received:
    """The service, in a thread of the executor; its connection goes back to the pool after."""
    try:
        with log_ids(request_id=request_id):
            return github_receive(**delivery)
    finally:
        connections.close_all()


async def _body(receive: Receive, declared: int, limit: int) -> bytes:
    """The body, read no further than one byte past the limit."""
    if declared > limit:
        return b"\0" * (limit + 1)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit or not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _answer(send: Send, status: int, body: dict[str, Any], kind: str, rid: str) -> None:
    raw = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(raw)).encode()),
                    (REQUEST_ID_HEADER.lower().encode(), rid.encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": raw})


def github_fast_path(app: ASGIApp) -> ASGIApp:
    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rid = plain_request_id(headers.get(REQUEST_ID_HEADER.lower(), ""))
        try:
            declared = int(headers.get("content-length") or 0)
        except ValueError:
            declared = 0
        limit = settings.HOOKS_GITHUB_MAX_BYTES
        body = await _body(receive, declared, limit)
        try:
            received = await sync_to_async(_receive, thread_sensitive=False)(
                rid,
                body=body,
                signature=headers.get("x-hub-signature-256", ""),
                event=headers.get("x-github-event", ""),
                delivery_id=headers.get("x-github-delivery", ""),
            )
        except WebhookRefused as refused:
            validation_failed("webhook")
            problem = {"type": "about:blank", "title": refused.title, "status": refused.status,
                       "detail": refused.detail, "instance": PATH}  # fmt: skip
            await _answer(send, refused.status, problem, "application/problem+json", rid)
            return
        answer = {"delivery": received.delivery_id, "event": received.event,
                  "outcome": received.outcome, "quantum_id": received.quantum_id}  # fmt: skip
        await _answer(send, 202, answer, "application/json", rid)

    return application
