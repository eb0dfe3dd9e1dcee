"""Locks across hosts, in Redis: one holder at a time for work that several machines share (a
quantum's pushes to the central repository, the merge queue's consumer, an improving pass).

A lock is a key set with NX and a TTL, its value the holder's own token: it is released only by
its holder (a Lua compare-and-delete) and renewed while held by the process's KeyKeeper (one
thread for every key of a TTL), so a long holder keeps it and a dead one loses it within the TTL. Each acquisition also draws a fencing token (INCR of a
counter beside the key): a later holder always has a larger one while Redis lives. The counter
restarts with Redis, and a holder paused past its TTL may still believe it holds the lock, so
what the lock guards must carry its own compare-and-set: for the central repository that is
git's (`push --force-with-lease`, and the agent's fence ref, psychonauts/workspaces/central.py).

Redis unavailable (a restart): acquiring keeps trying until `wait_s` has passed, then raises
LockUnavailable; a holder whose key vanished takes it back unless someone else has it by then
(`lost` tells).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

import redis
from django.conf import settings

from core.errors import AnnihilationError
from core.redis import get_redis

logger = logging.getLogger(__name__)

# Delete, or extend, the key only while it still holds our token (one round trip each).
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
_RENEW = (
    "local v = redis.call('get', KEYS[1]) "
    "if v == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
    "if not v then if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end end "
    "return 0"
)


class LockUnavailable(AnnihilationError):
    """The lock could not be had within its wait: another holder kept it, or Redis was down."""


@dataclass
class _Kept:
    token: str
    tag: object  # what the keeper's `beat` is told about the key (an agent run's id)
    on_lost: Callable[[], None] | None  # None: keep trying (the key is not given up)


class KeyKeeper:
    """Keeps Redis keys alive while their holders hold them: one thread per process, purpose and
    TTL, whatever the number of keys. Every third of the TTL one pipelined round trip renews each
    key that still holds its holder's token, takes back one Redis lost (a restart) unless someone
    else has it by then, and reports one another holder took (`on_lost`, after which the key is
    no longer kept). RedisLock and the agent leases (bursts.leases) keep their keys here; `beat`
    runs after each pass with the tags of the keys kept (the leases stamp their agents'
    heartbeat in the database with it), Redis reachable or not.

    A forked child (a prefork worker) inherits the keepers but not their threads: `get` starts
    its own."""

    _keepers: dict[tuple[str, int], KeyKeeper] = {}
    _keepers_lock = threading.Lock()

    def __init__(
        self, name: str, ttl_ms: int, beat: Callable[[list[object]], None] | None = None
    ) -> None:
        self.pid = os.getpid()
        self.name, self.ttl_ms, self.beat = name, ttl_ms, beat
        self.kept: dict[str, _Kept] = {}
        # Held during a pass and while a key is dropped: a pass never takes back (SET NX) a key
        # its holder has just released.
        self.changing = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"keep-{name}-{ttl_ms}", daemon=True)
        self.thread.start()

    @classmethod
    def get(
        cls, name: str, ttl_ms: int, beat: Callable[[list[object]], None] | None = None
    ) -> KeyKeeper:
        keeper = cls._keepers.get((name, ttl_ms))
        if keeper is not None and keeper.pid == os.getpid():
            return keeper
        with cls._keepers_lock:
            keeper = cls._keepers.get((name, ttl_ms))
            if keeper is None or keeper.pid != os.getpid():
                keeper = cls._keepers[(name, ttl_ms)] = cls(name, ttl_ms, beat)
            return keeper

    def hold(
        self,
        key: str,
        token: str,
        *,
        tag: object = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.kept[key] = _Kept(token, tag, on_lost)

    def drop(self, key: str) -> None:
        with self.changing:
            self.kept.pop(key, None)

    def _run(self) -> None:
        interval = max(self.ttl_ms / 3000, 0.01)
        while True:
            time.sleep(interval)
            kept = dict(self.kept)
            if not kept:
                continue
            try:
                with self.changing:
                    self._renew(kept)
            except redis.RedisError:
                logger.warning("%s: Redis unavailable, renewing at the next beat", self.name)
            if self.beat is not None:
                try:
                    self.beat([k.tag for k in kept.values()])
                except Exception:
                    logger.warning("%s: its beat failed", self.name, exc_info=True)

    def _renew(self, kept: dict[str, _Kept]) -> None:
        keys = [key for key in kept if key in self.kept]  # not released meanwhile
        if not keys:
            return
        with get_redis().pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.eval(_RENEW, 1, key, kept[key].token, self.ttl_ms)
            renewed = pipe.execute()
        for key, ok in zip(keys, renewed, strict=True):
            lost = kept[key].on_lost
            if not ok and lost is not None:
                logger.warning("%s: %s taken by another holder", self.name, key)
                self.kept.pop(key, None)
                lost()


class RedisLock:
    """`with RedisLock("name", ttl_s=30, wait_s=60) as lock: ... lock.fencing ...`.

    `wait_s`: how long to keep trying (0: one try; `held` tells, no error). Not reentrant."""

    def __init__(
        self, name: str, *, ttl_s: float = 30.0, wait_s: float = 60.0, poll_s: float = 0.05
    ) -> None:
        self.key = f"locks:{name}"
        self.ttl_ms = max(100, int(ttl_s * 1000))
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.token = f"{settings.ANNIHILATION_HOST}:{uuid.uuid4().hex[:16]}"
        self.held = False
        self.fencing = 0
        self._lost = threading.Event()

    @property
    def lost(self) -> bool:
        """Another holder took the key while this one held it (its TTL ran out unrenewed)."""
        return self._lost.is_set()

    def acquire(self) -> bool:
        deadline = time.monotonic() + self.wait_s
        delay = self.poll_s
        failure = ""
        while True:
            try:
                client = get_redis()
                if client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                    self.fencing = int(client.incr(f"{self.key}:fencing"))
                    self.held = True
                    break
                failure = "held by another holder"
                delay = self.poll_s
            except redis.RedisError as exc:
                failure = f"Redis unavailable ({exc})"
                delay = min(delay * 2, 1.0)
            if time.monotonic() + delay > deadline:
                if self.wait_s <= 0 and failure == "held by another holder":
                    return False
                raise LockUnavailable(
                    f"lock {self.key} not acquired within {self.wait_s:.0f}s: {failure}"
                )
            time.sleep(delay)
        KeyKeeper.get("locks", self.ttl_ms).hold(self.key, self.token, on_lost=self._lost.set)
        return True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        KeyKeeper.get("locks", self.ttl_ms).drop(self.key)
        try:
            get_redis().eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            logger.warning("lock %s: Redis unavailable, left to its TTL", self.key)

    def __enter__(self) -> RedisLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@contextmanager
def redis_lock_try(name: str, *, ttl_s: float = 60.0) -> Iterator[bool]:
    """A RedisLock without waiting: True when held (for the block), False when another holder
    has it. Redis unavailable: False too (the caller's work is skipped, as when busy)."""
    lock = RedisLock(name, ttl_s=ttl_s, wait_s=0)
    try:
        held = lock.acquire()
    except LockUnavailable:
        held = False
    try:
        yield held
    finally:
        lock.release()
