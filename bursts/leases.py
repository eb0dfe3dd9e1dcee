"""Agent leases in Redis: who is executing an agent run right now, kept alive by a heartbeat.

A stage task takes the lease (SET NX) before it executes an agent run, so a redelivered or
re-dispatched task never runs the same agent twice at once. The process's keeper of agent leases
(core.locks.KeyKeeper, as for every Redis lock) renews the leases it holds every third of the
TTL and also stamps AgentRun.heartbeat_at (through the AgentRun writer), so that losing Redis (a
restart empties it) is not mistaken for a dead worker: the safety net needs both signs gone
before it takes over.
"""

from __future__ import annotations

import logging
import time
import uuid
from types import TracebackType

import redis
from django.conf import settings
from django.db import connections
from django.utils import timezone

from core.locks import KeyKeeper
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


def _stamp(agent_run_ids: list[object]) -> None:
    """After each renewal pass: stamp heartbeat_at of every attempt this process holds a lease
    on, in one UPDATE (Redis reachable or not)."""
    # Imported here: bursts.services imports this module (a slot takes a lease).
    from bursts.services.agent_runs import agent_runs_heartbeat

    try:
        agent_runs_heartbeat(
            agent_run_ids=[i for i in agent_run_ids if isinstance(i, int)], now=timezone.now()
        )
    except Exception:
        logger.warning("lease heartbeat: database unavailable", exc_info=True)
    finally:
        # The keeper thread's connection goes back to the pool between beats (a broken one is
        # dropped): a worker's agents, not this thread, size the pool.
        connections.close_all()


def _keeper(ttl_ms: int) -> KeyKeeper:
    """The process's keeper of agent leases: one thread renews every lease it holds each third
    of the TTL, in one pipelined round trip, then stamps their heartbeats (a thread per lease
    would cost more than a short agent)."""
    return KeyKeeper.get("agent-leases", ttl_ms, beat=_stamp)


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
            _keeper(self.ttl_ms).hold(self.key, self.token, tag=self.agent_run_id)
            return self
        client, deadline = get_redis(), time.monotonic() + self.wait_s
        while True:
            self.held = bool(client.set(self.key, self.token, nx=True, px=self.ttl_ms))
            if self.held or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if self.held:
            _keeper(self.ttl_ms).hold(self.key, self.token, tag=self.agent_run_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.held:
            return
        _keeper(self.ttl_ms).drop(self.key)
        if self.expire:
            return
        try:
            get_redis().eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            logger.warning("cannot release lease %s: Redis unavailable", self.key)
