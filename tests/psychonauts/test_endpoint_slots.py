"""An endpoint's slots: waiters served in order, so agents sharing a one-slot endpoint take turns.
Real calls through the registry's provider against a local fake OpenAI-compatible server, real
Redis."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from psychonauts import endpoints, semaphore
from psychonauts.endpoints import endpoint_add, endpoint_provider, registry_snapshot
from psychonauts.errors import SlotTimeout
from psychonauts.providers.base import ProviderRequest, RunInfo
from tests.fakes.openai_server import FakeReply, fake_openai_server

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh(settings, redis_client):
    settings.ENDPOINTS_CACHE_S = 0
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    endpoints._reset_at.clear()
    endpoints.registry_invalidate()
    yield
    endpoints.registry_invalidate()


def _request(agent: int, model: str) -> ProviderRequest:
    run = RunInfo(agent_run_id=agent, agent_id=f"a{agent}", role="coder", attempt=1, quantum_id=1)
    return ProviderRequest(
        model=model,
        system="",
        tools=[],
        max_tokens=5,
        run=run,
        messages=[{"role": "user", "content": f"agent {agent}"}],
    )


def test_two_agents_on_a_one_slot_endpoint_take_turns():
    """Each agent calls the model again as soon as its last call ends (its tools take no time):
    the other, waiting, gets the slot first."""
    turns: list[int] = []
    stop = threading.Event()
    with fake_openai_server(lambda body: FakeReply(text="ok", delay_s=0.03)) as fake:
        endpoint_add(name="local", model="qwen", base_url=fake.base_url, max_concurrency=1)
        [conf] = registry_snapshot()
        provider = endpoint_provider(conf)

        def agent(n: int) -> None:
            while not stop.is_set():
                provider.complete(_request(n, conf.model), lambda text: None)
                turns.append(n)
                if len(turns) >= 20:
                    stop.set()

        threads = [threading.Thread(target=agent, args=(n,)) for n in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert fake.max_in_flight == 1
    turns = turns[:20]
    assert turns.count(1) >= 9 and turns.count(2) >= 9, turns
    # Neither goes twice in a row while the other waits (once, as they start, at most).
    repeats = sum(1 for a, b in itertools.pairwise(turns) if a == b)
    assert repeats <= 1, turns


def test_a_waiter_ahead_in_the_queue_is_served_first(redis_client):
    key = "endpoints:slots:ordered"
    assert semaphore.slot_try_acquire("holder", limit=1, key=key)
    served: list[str] = []

    def wait(name: str) -> None:
        semaphore.slot_acquire(name, limit=1, wait_s=10, key=key)
        served.append(name)
        semaphore.slot_release(name, key=key)

    first = threading.Thread(target=wait, args=("first",))
    first.start()
    while not redis_client.zscore(f"{key}:queue", "first"):
        time.sleep(0.001)
    second = threading.Thread(target=wait, args=("second",))
    second.start()
    while not redis_client.zscore(f"{key}:queue", "second"):
        time.sleep(0.001)
    # A caller that does not queue gets nothing while waiters are owed the slot.
    semaphore.slot_release("holder", key=key)
    assert not semaphore.slot_try_acquire("latecomer", limit=1, key=key)
    first.join(timeout=10)
    second.join(timeout=10)

    assert served == ["first", "second"]


def test_a_waiter_that_gives_up_leaves_the_queue(redis_client):
    key = "endpoints:slots:patience"
    assert semaphore.slot_try_acquire("holder", limit=1, key=key)
    with pytest.raises(SlotTimeout):
        semaphore.slot_acquire("impatient", limit=1, wait_s=0.05, key=key)

    assert redis_client.zcard(f"{key}:queue") == 0
    semaphore.slot_release("holder", key=key)
    assert semaphore.slot_try_acquire("next", limit=1, key=key)
