"""The API through the real ASGI application: daphne in its own process on the test database,
spoken to over HTTP as a client program would."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.services import token_create
from quanta.models import Quantum
from tests.bursts.conftest import ROOT, worker_env

WRITES_PER_MIN = 4


@pytest.fixture
def server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = worker_env(
        DEBUG="true",
        ANNIHILATION_HOME=str(tmp_path),
        ANNIHILATION_API_WRITES_PER_MIN=str(WRITES_PER_MIN),
    )
    log = (tmp_path / "daphne.log").open("ab")
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "annihilation.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or web.poll() is not None:
                    raise AssertionError((tmp_path / "daphne.log").read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        web.terminate()
        try:
            web.wait(10)
        except subprocess.TimeoutExpired:
            web.kill()
        log.close()


def call(
    url: str, method: str = "GET", body: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_a_client_program_uses_the_api_over_http(server: str, redis_client: Any) -> None:
    secret = token_create(name="script", scopes=["read", "operate"]).secret
    auth = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}

    status, headers, body = call(f"{server}/api/quanta")
    assert status == 401 and headers["Content-Type"] == "application/problem+json"
    assert body["type"] == "urn:annihilation:problem:unauthenticated"

    payload = json.dumps({"title": "Over HTTP", "labels": ["asgi"]}).encode()
    status, _, created = call(
        f"{server}/api/quanta", "POST", payload, **auth, **{"Idempotency-Key": "once"}
    )
    assert status == 201 and created["title"] == "Over HTTP"
    status, headers, replayed = call(
        f"{server}/api/quanta", "POST", payload, **auth, **{"Idempotency-Key": "once"}
    )
    assert (status, replayed, headers["Idempotent-Replayed"]) == (201, created, "true")
    assert Quantum.objects.filter(title="Over HTTP").count() == 1

    status, _, page = call(f"{server}/api/quanta?label=asgi", "GET", None, **auth)
    assert status == 200 and [q["id"] for q in page["items"]] == [created["id"]]

    status, headers, problem = call(f"{server}/api/quanta", "POST", b'{"title": ', **auth)
    assert (status, problem["type"]) == (400, "urn:annihilation:problem:malformed")
    assert headers["Content-Type"] == "application/problem+json"

    # Three writes so far (the replay and the malformed one count too): one left, then 429.
    statuses = [
        call(f"{server}/api/quanta", "POST", json.dumps({"title": f"n{i}"}).encode(), **auth)[0]
        for i in range(3)
    ]
    assert statuses == [201, 429, 429]
    status, headers, problem = call(
        f"{server}/api/quanta", "POST", json.dumps({"title": "late"}).encode(), **auth
    )
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert problem["type"] == "urn:annihilation:problem:rate-limited"
    assert not Quantum.objects.filter(title="late").exists()

    status, _, schema = call(f"{server}/api/openapi.json")
    assert status == 200 and "/api/quanta" in schema["paths"]
