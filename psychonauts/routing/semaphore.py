"""The global recursion semaphore: a counting semaphore of N slots in Redis.

A slot is a member of a sorted set scored by its expiry time. Holders renew while they work, so
a slot whose holder died (process killed, machine gone) expires and is reclaimed by the next
acquire: no slot leaks.

Waiters are served in order. A waiter takes a ticket (`<key>:ticket`) and stands in a queue
(`<key>:queue`, scored by ticket); a free slot goes only to the waiters at the head of the queue,
as many as there are free slots, and a caller that does not queue (`slot_try_acquire`) gets one
only when no waiter is owed it. A holder that gives its slot back and asks again (an agent
between two model calls of its own) takes a new ticket, behind whoever waited meanwhile: with
one slot, two agents alternate. Waiters ask again every few milliseconds at the head of the
queue, less often further back; one that stops asking (its process died) leaves the queue after
WAITER_TTL_MS (`<key>:queue:ttl`, its deadline).

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

WAITER_TTL_MS = 10_000

# KEYS: the holders, the queue, the queue's deadlines, the ticket counter.
# ARGV: holder, limit, ttl_ms, queue (1: join the queue when no slot is owed), waiter_ttl_ms.
# Returns -1 when the holder has a slot, else its place in the queue (0: next).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
for _, waiter in ipairs(gone) do
  redis.call('ZREM', KEYS[2], waiter)
  redis.call('ZREM', KEYS[3], waiter)
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  return -1
end
local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local place = redis.call('ZRANK', KEYS[2], ARGV[1])
if not place then
  place = redis.call('ZCARD', KEYS[2])
end
if place < free then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return -1
end
if ARGV[4] == '1' then
  if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
end
return place
"""

_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""


def _ttl_ms() -> int:
    return int(settings.PSYCHONAUTS_SLOT_TTL_S * 1000)


# Another semaphore (`key`) works the same way: a model endpoint's in-flight limit
# (`psychonauts.routing.endpoints`) is one per endpoint.


def _acquire(holder: str, *, limit: int | None, key: str, queue: bool) -> int:
    slots = limit or settings.PSYCHONAUTS_SPAWN_SLOTS
    keys = (key, f"{key}:queue", f"{key}:queue:ttl", f"{key}:ticket")
    args = (holder, slots, _ttl_ms(), "1" if queue else "0", WAITER_TTL_MS)
    return int(get_redis().eval(_ACQUIRE, 4, *keys, *args))


def slot_try_acquire(holder: str, *, limit: int | None = None, key: str = KEY) -> bool:
    """A slot now if one is free and no waiter is owed it; never queues."""
    return _acquire(holder, limit=limit, key=key, queue=False) == -1


def _leave_queue(holder: str, key: str) -> None:
    pipe = get_redis().pipeline(transaction=False)
    pipe.zrem(f"{key}:queue", holder)
    pipe.zrem(f"{key}:queue:ttl", holder)
    pipe.execute()


def slot_acquire(
    holder: str, *, limit: int | None = None, wait_s: float | None = None, key: str = KEY
) -> None:
    """Wait in the queue for a slot; SlotTimeout after `wait_s` (the waiter leaves the queue)."""
    deadline = time.monotonic() + (settings.PSYCHONAUTS_SLOT_WAIT_S if wait_s is None else wait_s)
    try:
        while (place := _acquire(holder, limit=limit, key=key, queue=True)) != -1:
            if time.monotonic() >= deadline:
                raise SlotTimeout(
                    f"no {'recursion ' if key == KEY else ''}slot free for {holder} in time"
                )
            # The head of the queue asks again soon; those behind it, less often.
            time.sleep(min(0.005 * (place + 1), 0.25))
    except BaseException:
        _leave_queue(holder, key)
        raise


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
