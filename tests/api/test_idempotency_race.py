"""Two requests with the same Idempotency-Key at the same moment: one runs, the other waits
for it and replays its response (each request in its own thread and database connection)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

from api.services import token_create
from quanta.models import Quantum
from tests.api.conftest import ApiClient


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_create_once(redis_client: Any) -> None:
    secret = token_create(name="racer", scopes=["operate"]).secret
    barrier = threading.Barrier(4)
    responses: list[Any] = []
    lock = threading.Lock()

    def send() -> None:
        client = ApiClient(secret)
        barrier.wait()
        try:
            response = client.post(
                "/api/quanta", {"title": "Raced"}, **{"Idempotency-Key": "same-moment"}
            )
            with lock:
                responses.append(response)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in responses] == [201] * 4
    assert all(r.json() == responses[0].json() for r in responses)
    assert sum("Idempotent-Replayed" in r for r in responses) == 3
    assert Quantum.objects.filter(title="Raced").count() == 1
