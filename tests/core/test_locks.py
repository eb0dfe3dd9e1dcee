"""Redis locks and the agent leases keep their keys alive the same way: one keeper thread per
process and TTL renews every key held, a lock another holder took says so, a released key is
never taken back."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from bursts.leases import AgentLease, lease_key
from bursts.models import AgentRun
from core.locks import RedisLock
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.runs import agent_run_create
from quanta.services import quantum_create
from tests.polling import wait_for


def _keepers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"keep-{name}"]


def test_one_holder_at_a_time_and_a_release_frees_it(redis_client: redis.Redis) -> None:
    with RedisLock("t:one", ttl_s=5, wait_s=0) as first:
        assert first.held and first.fencing >= 1
        assert not RedisLock("t:one", ttl_s=5, wait_s=0).acquire()
    with RedisLock("t:one", ttl_s=5, wait_s=0) as again:
        assert again.held and again.fencing > first.fencing


def test_a_holder_keeps_its_lock_past_the_ttl(redis_client: redis.Redis) -> None:
    with RedisLock("t:long", ttl_s=0.3, wait_s=0) as lock:
        until = time.monotonic() + 1.2  # four TTLs: alive only if renewed
        while time.monotonic() < until:
            assert redis_client.get(lock.key) == lock.token
            time.sleep(0.02)
        assert not RedisLock("t:long", ttl_s=0.3, wait_s=0).acquire()
        assert not lock.lost
    assert redis_client.get(lock.key) is None


def test_a_lock_taken_by_another_holder_says_it_is_lost(redis_client: redis.Redis) -> None:
    lock = RedisLock("t:lost", ttl_s=0.3, wait_s=0)
    assert lock.acquire()
    redis_client.set(lock.key, "someone-else")
    wait_for(lambda: lock.lost, timeout=5, what="the lock to be lost")
    lock.release()
    assert redis_client.get(lock.key) == "someone-else"  # not its to delete


def test_every_lock_of_a_ttl_is_kept_by_one_thread(redis_client: redis.Redis) -> None:
    locks = [RedisLock(f"t:many:{n}", ttl_s=0.6, wait_s=0) for n in range(20)]
    for lock in locks:
        assert lock.acquire()
    try:
        assert len(_keepers("locks-600")) == 1
    finally:
        for lock in locks:
            lock.release()


@pytest.mark.django_db(transaction=True)
def test_an_agent_lease_is_kept_and_its_heartbeat_stamped(
    redis_client: redis.Redis, settings: Any
) -> None:
    settings.BURSTS_HEARTBEAT_TTL_S = 0.3
    roles_sync_defaults()
    run = agent_run_create(quantum_id=quantum_create(title="leased").pk, role="coder")
    AgentRun.objects.filter(pk=run.pk).update(heartbeat_at=None)
    with AgentLease(run.pk) as lease:
        assert lease.held
        wait_for(
            lambda: AgentRun.objects.filter(pk=run.pk, heartbeat_at__isnull=False).exists(),
            timeout=5,
            what="the heartbeat",
        )
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            assert redis_client.get(lease_key(run.pk)) == lease.token
            time.sleep(0.02)
        assert len(_keepers("agent-leases-300")) == 1
    assert redis_client.get(lease_key(run.pk)) is None
