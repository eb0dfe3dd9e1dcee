"""Agent leases in Redis: who is executing an agent run right now, kept alive by a heartbeat.

A stage task takes the lease (SET NX) before it executes an agent run, so a redelivered or
re-dispatched task never runs the same agent twice at once. One thread per process renews the
leases it holds every third of the TTL and also stamps AgentRun.heartbeat_at (through the
AgentRun writer), so that losing Redis (a restart empties it) is not mistaken for a dead
worker: the safety net needs both signs gone before it takes over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from types import TracebackType

import redis
from django.conf import settings
from django.db import connections
from django.utils import timezone

from core.redis import get_redis

logger = logging.getLogger(__name__)


# Delete the key only if we still hold it (one round trip, no race with a successor).
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


def lease_key(agent_run_id: int) -> str:
    return f"bursts:lease:{agent_run_id}"


def lease_alive(agent_run_ids: list[int]) -> set[int]:
    """The agent runs among these whose lease is held right now (empty if Redis is down)."""
    if not agent_run_ids:
        return set()
    try:
        values = get_redis().mget([lease_key(i) for i in agent_run_ids])
    except redis.RedisError:
        logger.warning("cannot read agent leases: Redis unavailable")
        return set()
    return {i for i, v in zip(agent_run_ids, values, strict=True) if v is not None}


class _Heartbeat:
    """One thread per process renews every lease the process holds (a thread per lease cost
    more to start and join than a no-op agent). Each beat reads the keys in one MGET,
    renews each, and stamps heartbeat_at for all of them in one UPDATE."""

    _lock = threading.Lock()
    current: _Heartbeat | None = None

    def __init__(self, ttl_ms: int) -> None:
        self.pid = os.getpid()
        self.ttl_ms = ttl_ms
        self.held: dict[str, tuple[str, int]] = {}  # key -> (token, agent_run_id)
        # Held during a renewal pass and while a lease is dropped, so a pass never takes back
        # (SET NX) a key its holder has just released.
        self.renewing = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="agent-leases", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls, ttl_ms: int) -> _Heartbeat:
        beat = cls.current
        if beat is not None and beat.pid == os.getpid() and beat.ttl_ms == ttl_ms:
            return beat
        with cls._lock:
            # A forked child inherits the object but not its thread: start anew.
            if (
                cls.current is None
                or cls.current.pid != os.getpid()
                or cls.current.ttl_ms != ttl_ms
            ):
                cls.current = _Heartbeat(ttl_ms)
            return cls.current

    def _run(self) -> None:
        # Imported here: bursts.services imports this module (a slot takes a lease).
        from bursts.services.agent_runs import agent_runs_heartbeat

        interval = max(self.ttl_ms / 3000, 0.1)
        while True:
            time.sleep(interval)
            held = dict(self.held)
            if not held:
                continue
            try:
                with self.renewing:
                    self._renew(held)
            except redis.RedisError:
                logger.warning("lease heartbeat: Redis unavailable")
            try:
                agent_runs_heartbeat(
                    agent_run_ids=[i for _, i in held.values()], now=timezone.now()
                )
            except Exception:
                logger.warning("lease heartbeat: database unavailable", exc_info=True)
                connections.close_all()  # this thread's own connection: reopen next beat

    def _renew(self, held: dict[str, tuple[str, int]]) -> None:
        client = get_redis()
        keys = list(held)
        for key, current in zip(keys, client.mget(keys), strict=True):
            token = held[key][0]
            if key not in self.held:
                continue  # released meanwhile
            if current == token:
                client.pexpire(key, self.ttl_ms)
            elif current is None:
                # Redis lost it (restart): take it back unless someone else already has.
                client.set(key, token, nx=True, px=self.ttl_ms)


class AgentLease:
    """`with AgentLease(id) as lease: if lease.held: ...` — renewed until the block ends.

    `wait_s`: how long to keep trying when another holder has it (a resumed agent's task may
    arrive while the worker it suspended on is still letting go of the lease).

    `claimed`: the caller already won the attempt in the database (the start compare-and-set
    moved it from pending to running, stamping worker and heartbeat_at), which is what keeps a
    second executor out; the key is then set by the heartbeat's next beat (SET NX, as after a
    Redis restart) rather than now, so an agent shorter than a beat costs no Redis round trip.
    Until then the fresh heartbeat_at stands for the lease: the safety net needs both gone, and
    a take-over needs a stale heartbeat."""

    def __init__(self, agent_run_id: int, *, wait_s: float = 0.0, claimed: bool = False) -> None:
        self.agent_run_id = agent_run_id
        self.wait_s = wait_s
        self.claimed = claimed
        self.key = lease_key(agent_run_id)
        self.token = f"{settings.ANNIHILATION_HOST}:{uuid.uuid4().hex[:12]}"
        self.ttl_ms = int(settings.BURSTS_HEARTBEAT_TTL_S * 1000)
        self.held = False
        self.expire = False

    def let_expire(self) -> None:
        """Stop renewing at the end of the block but leave the key to its TTL instead of
        deleting it: for an attempt that ended (done or error) nobody waits for this lease
        again (a retry is a new row with its own key, only a waiting agent is resumed), so the
        round trip of the release buys nothing. A redelivered task that meets the key goes to
        the general path, which reads the ended attempt before it looks at leases."""
        self.expire = True

    def __enter__(self) -> AgentLease:
        # The caller stamps heartbeat_at in the same UPDATE that marks the agent running.
        if self.claimed:
            self.held = True
            _Heartbeat.get(self.ttl_ms).held[self.key] = (self.token, self.agent_run_id)
            return self
        client, deadline = get_redis(), time.monotonic() + self.wait_s
        while True:
            self.held = bool(client.set(self.key, self.token, nx=True, px=self.ttl_ms))
            if self.held or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if self.held:
            _Heartbeat.get(self.ttl_ms).held[self.key] = (self.token, self.agent_run_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.held:
            return
        beat = _Heartbeat.get(self.ttl_ms)
        with beat.renewing:
            beat.held.pop(self.key, None)
        if self.expire:
            return
        try:
            get_redis().eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            logger.warning("cannot release lease %s: Redis unavailable", self.key)
