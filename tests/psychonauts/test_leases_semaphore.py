from __future__ import annotations

import threading
import time

import pytest

from psychonauts.errors import LeaseConflict, SlotTimeout
from psychonauts.routing import semaphore
from psychonauts.runtime import leases


def test_it_refuses_a_second_exclusive_lease(redis_client):
    leases.lease_acquire(workspace="/w", path="a.py", holder="agent-1", mode="exclusive")

    with pytest.raises(LeaseConflict, match="leased by agent-1"):
        leases.lease_acquire(workspace="/w", path="a.py", holder="agent-2", mode="exclusive")
    with pytest.raises(LeaseConflict):
        leases.lease_acquire(workspace="/w", path="a.py", holder="agent-2", mode="shared_read")
    # Another path, or another workspace, is free.
    leases.lease_acquire(workspace="/w", path="b.py", holder="agent-2", mode="exclusive")
    leases.lease_acquire(workspace="/other", path="a.py", holder="agent-2", mode="exclusive")


def test_it_shares_reads_but_refuses_a_writer_while_others_read(redis_client):
    leases.lease_acquire(workspace="/w", path="a.py", holder="r1", mode="shared_read")
    leases.lease_acquire(workspace="/w", path="a.py", holder="r2", mode="shared_read")

    with pytest.raises(LeaseConflict):
        leases.lease_acquire(workspace="/w", path="a.py", holder="w", mode="exclusive")
    leases.lease_release(workspace="/w", path="a.py", holder="r1")
    leases.lease_release(workspace="/w", path="a.py", holder="r2")
    leases.lease_acquire(workspace="/w", path="a.py", holder="w", mode="exclusive")


def test_it_frees_an_expired_lease_and_sweeps_expired_readers(redis_client):
    leases.lease_acquire(workspace="/w", path="a.py", holder="dead", mode="exclusive", ttl_s=0.1)
    leases.lease_acquire(workspace="/w", path="b.py", holder="dead", mode="shared_read", ttl_s=0.1)
    leases.lease_acquire(workspace="/w", path="b.py", holder="alive", mode="shared_read", ttl_s=60)
    time.sleep(0.2)

    leases.lease_acquire(workspace="/w", path="a.py", holder="next", mode="exclusive")
    assert leases.leases_sweep() == 1
    assert not leases.lease_renew(workspace="/w", path="b.py", holder="dead")
    assert leases.lease_renew(workspace="/w", path="b.py", holder="alive")


def test_it_keeps_a_renewed_lease_alive(redis_client):
    leases.lease_acquire(workspace="/w", path="a.py", holder="me", mode="exclusive", ttl_s=0.3)
    for _ in range(3):
        time.sleep(0.15)
        assert leases.lease_renew(workspace="/w", path="a.py", holder="me", ttl_s=0.3)

    with pytest.raises(LeaseConflict):
        leases.lease_acquire(workspace="/w", path="a.py", holder="other", mode="exclusive")
    assert not leases.lease_renew(workspace="/w", path="a.py", holder="other")


def test_it_grants_an_exclusive_lease_to_exactly_one_of_many_racers(redis_client):
    winners: list[str] = []
    barrier = threading.Barrier(20)

    def race(n: int) -> None:
        barrier.wait()
        try:
            leases.lease_acquire(workspace="/w", path="hot.py", holder=f"a{n}", mode="exclusive")
            winners.append(f"a{n}")
        except LeaseConflict:
            pass

    threads = [threading.Thread(target=race, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(winners) == 1


def test_it_never_lets_more_holders_in_than_slots(redis_client, settings):
    settings.PSYCHONAUTS_SLOT_TTL_S = 10
    limit, inside, peak = 3, [0], [0]
    lock = threading.Lock()

    def work(n: int) -> None:
        with semaphore.slot_held(f"h{n}", limit=limit):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert peak[0] == limit, "waiters queued and all got a slot, never more than the limit"
    assert semaphore.slots_in_use() == 0


def test_it_reclaims_the_slot_of_a_holder_that_died(redis_client, settings):
    settings.PSYCHONAUTS_SLOT_TTL_S = 1
    # A holder takes the only slot and dies without releasing it (no renewal, no release).
    assert semaphore.slot_try_acquire("dead-holder", limit=1)
    with pytest.raises(SlotTimeout):
        semaphore.slot_acquire("waiter", limit=1, wait_s=0.2)

    started = time.monotonic()
    semaphore.slot_acquire("waiter", limit=1, wait_s=5)

    assert time.monotonic() - started < 2
    assert semaphore.slots_in_use() == 1
