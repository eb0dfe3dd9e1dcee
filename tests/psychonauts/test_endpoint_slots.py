"""An endpoint's slots: waiters served in order, so agents sharing a one-slot endpoint take turns.
Real calls through the registry's provider against a local fake OpenAI-compatible server, real
Redis."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from psychonauts.errors import SlotTimeout
from psychonauts.routing import endpoints, ratelimits, semaphore
from psychonauts.routing.endpoints import endpoint_add, endpoint_provider, registry_snapshot
from psychonauts.routing.providers.base import ProviderRequest, RunInfo
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


# --- rate limits --------------------------------------------------------------------------------


def test_a_rate_limited_call_waits_without_its_slot_and_lowers_the_concurrency(
    settings, redis_client
):
    """The first call is refused (429, retry-after 0.6 s); while it waits, another agent's call
    takes the endpoint's only slot and is answered; then the first is answered too, its
    request the same. The endpoint's concurrency is marked lowered for every worker."""
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 3  # the SDK's own retries, were they used
    refused = threading.Event()
    done: list[int] = []

    def reply(body):
        if "agent 1" in json.dumps(body) and not refused.is_set():
            refused.set()
            return FakeReply(status=429, retry_after="0.6")
        return FakeReply(text="ok", delay_s=0.05)

    with fake_openai_server(reply) as fake:
        endpoint_add(name="busy", model="qwen", base_url=fake.base_url, max_concurrency=1)
        [conf] = registry_snapshot()
        provider = endpoint_provider(conf)

        def agent(n: int) -> None:
            provider.complete(_request(n, conf.model), lambda text: None)
            done.append(n)

        first = threading.Thread(target=agent, args=(1,))
        first.start()
        assert refused.wait(10)
        key, deadline = ratelimits.LIMIT_PREFIX + "busy", time.monotonic() + 10
        while not redis_client.get(key) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert float(redis_client.get(key)) == 1
        second = threading.Thread(target=agent, args=(2,))
        second.start()
        second.join(10)
        first.join(10)

    assert done == [2, 1]
    bodies = [json.dumps(r["messages"]) for r in fake.requests]
    assert bodies.count(json.dumps(fake.requests[0]["messages"])) == 2  # the same request again


def test_good_calls_raise_the_concurrency_back_one_slot_at_a_time(redis_client):
    assert ratelimits.endpoint_rate_limited("gpu", 8) == 4
    assert ratelimits.endpoint_rate_limited("gpu", 8) == 2
    assert ratelimits.endpoint_limit("gpu", 8) == 2
    for _ in range(2):
        ratelimits.endpoint_call_succeeded("gpu", 8)
    assert ratelimits.endpoint_limit("gpu", 8) == 2  # 2 + 1/2 + 1/2.5
    ratelimits.endpoint_call_succeeded("gpu", 8)
    assert ratelimits.endpoint_limit("gpu", 8) == 3
    for _ in range(40):
        ratelimits.endpoint_call_succeeded("gpu", 8)
    assert ratelimits.endpoint_limit("gpu", 8) == 8
    assert redis_client.get(ratelimits.LIMIT_PREFIX + "gpu") is None
