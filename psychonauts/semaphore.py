"""The global recursion semaphore: a counting semaphore of N slots in Redis.

A slot is a member of a sorted set scored by its expiry time. Holders renew while they work, so
a slot whose holder died (process killed, machine gone) expires and is reclaimed by the next
acquire: no slot leaks. Waiters queue by polling with a short back-off until a slot is free.

Deadlock: a parent waiting for its children must not sit on a slot, or N parents could hold
all N slots while their children wait forever. `slot_released_while` gives the slot back for
the duration of the wait and takes one again afterwards; children run in the parent's process
(threads), so no Celery worker slot is held by a waiting parent either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from core.redis import get_redis
from psychonauts.errors import SlotTimeout

KEY = "semaphore:spawn"

# KEYS: the set. ARGV: holder, limit, ttl_ms. Returns 1 when the holder has a slot.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  return 1
end
return 0
"""

_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""


def _ttl_ms() -> int:
    return int(settings.PSYCHONAUTS_SLOT_TTL_S * 1000)


# Another semaphore (`key`) works the same way: a model endpoint's in-flight limit
# (`psychonauts.endpoints`) is one per endpoint.


def slot_try_acquire(holder: str, *, limit: int | None = None, key: str = KEY) -> bool:
    slots = limit or settings.PSYCHONAUTS_SPAWN_SLOTS
    return bool(get_redis().eval(_ACQUIRE, 1, key, holder, slots, _ttl_ms()))


def slot_acquire(
    holder: str, *, limit: int | None = None, wait_s: float | None = None, key: str = KEY
) -> None:
    """Wait (queue) for a slot; SlotTimeout after `wait_s`."""
    deadline = time.monotonic() + (settings.PSYCHONAUTS_SLOT_WAIT_S if wait_s is None else wait_s)
    pause = 0.01
    while not slot_try_acquire(holder, limit=limit, key=key):
        if time.monotonic() >= deadline:
            raise SlotTimeout(
                f"no {'recursion ' if key == KEY else ''}slot free for {holder} in time"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def slot_renew(holder: str, *, key: str = KEY) -> None:
    get_redis().eval(_RENEW, 1, key, holder, _ttl_ms())


def slot_release(holder: str, *, key: str = KEY) -> None:
    get_redis().zrem(key, holder)


def slots_in_use(*, key: str = KEY) -> int:
    client = get_redis()
    now_s, now_us = client.time()
    return int(client.zcount(key, now_s * 1000 + now_us // 1000, "+inf"))


@contextmanager
def slot_held(
    holder: str, *, limit: int | None = None, wait_s: float | None = None, key: str = KEY
) -> Iterator[None]:
    """Hold a slot for the block, renewing it in the background until the block ends."""
    slot_acquire(holder, limit=limit, wait_s=wait_s, key=key)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(settings.PSYCHONAUTS_SLOT_TTL_S / 3):
            slot_renew(holder, key=key)

    renewer = threading.Thread(target=renew, name=f"slot-renew-{holder}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        slot_release(holder, key=key)


@contextmanager
def slot_released_while(holder: str, *, limit: int | None = None) -> Iterator[None]:
    """Give `holder`'s slot back while it waits on others (children), then take one again."""
    had = bool(get_redis().zscore(KEY, holder))
    if had:
        slot_release(holder)
    try:
        yield
    finally:
        if had:
            slot_acquire(holder, limit=limit)
