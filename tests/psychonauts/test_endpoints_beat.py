"""The health beat in a real Celery worker with its embedded beat: an endpoint that stops
answering is marked down with the reason, and up again once it answers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from psychonauts.models import Endpoint
from psychonauts.routing.endpoints import endpoint_add, endpoint_down
from tests.bursts.conftest import fast_settings, make_worker, step_log  # noqa: F401
from tests.fakes.openai_server import FakeReply, fake_openai_server

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_health(name: str, health: str, timeout: float = 30) -> Endpoint:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = Endpoint.objects.get(name=name)
        if row.health == health:
            return row
        time.sleep(0.2)
    raise AssertionError(f"endpoint {name} not {health} within {timeout}s: {row.health}")


def test_the_beat_marks_an_endpoint_down_and_up_again(
    make_worker: Callable[..., object],  # noqa: F811 (the fixture imported above)
    redis_client,
):
    with fake_openai_server(lambda body: FakeReply(text="o"), models=["llama3"]) as fake:
        endpoint_add(name="gpu-a", model="llama3", base_url=fake.base_url)
        make_worker("endpoints-beat", ANNIHILATION_ENDPOINTS_HEALTH_EVERY_S="1")

        _wait_health("gpu-a", "up")
        fake.models_status = 500
        row = _wait_health("gpu-a", "down")
        assert "500" in row.health_reason
        assert endpoint_down("openai", "gpu-a")

        fake.models_status = 200
        _wait_health("gpu-a", "up")

    assert not endpoint_down("openai", "gpu-a")
    assert any(r.get("max_tokens") == 1 for r in fake.requests)  # it came back on an answer
