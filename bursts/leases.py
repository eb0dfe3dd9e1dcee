"""Agent leases in Redis: who is executing an agent run right now, kept alive by a heartbeat.

A stage task takes the lease (SET NX) before it executes an agent run, so a redelivered or
re-dispatched task never runs the same agent twice at once. A thread renews it every third of
the TTL and also stamps AgentRun.heartbeat_at, so that losing Redis (a restart empties it) is
not mistaken for a dead worker: the safety net needs both signs gone before it takes over.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from types import TracebackType

import redis
from django.conf import settings
from django.db import connections
from django.utils import timezone

from annihilation.redis import get_redis
from bursts.models import AgentRun

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


class AgentLease:
    """`with AgentLease(id) as lease: if lease.held: ...` — renewed until the block ends."""

    def __init__(self, agent_run_id: int) -> None:
        self.agent_run_id = agent_run_id
        self.key = lease_key(agent_run_id)
        self.token = f"{socket.gethostname()}:{uuid.uuid4().hex[:12]}"
        self.ttl_ms = int(settings.BURSTS_HEARTBEAT_TTL_S * 1000)
        self.held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> AgentLease:
        # The caller stamps heartbeat_at in the same UPDATE that marks the agent running.
        self.held = bool(get_redis().set(self.key, self.token, nx=True, px=self.ttl_ms))
        if self.held:
            self._thread = threading.Thread(target=self._run, name=f"lease-{self.key}", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            get_redis().eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            logger.warning("cannot release lease %s: Redis unavailable", self.key)

    def _beat_db(self) -> None:
        AgentRun.objects.filter(pk=self.agent_run_id).update(heartbeat_at=timezone.now())

    def _run(self) -> None:
        interval = max(self.ttl_ms / 3000, 0.1)
        try:
            while not self._stop.wait(interval):
                try:
                    client = get_redis()
                    current = client.get(self.key)
                    if current == self.token:
                        client.pexpire(self.key, self.ttl_ms)
                    elif current is None:
                        # Redis lost it (restart): take it back unless someone else already has.
                        client.set(self.key, self.token, nx=True, px=self.ttl_ms)
                except redis.RedisError:
                    logger.warning("heartbeat for %s: Redis unavailable", self.key)
                try:
                    self._beat_db()
                except Exception:
                    logger.warning(
                        "heartbeat for %s: database unavailable", self.key, exc_info=True
                    )
        finally:
            # This thread's own database connection.
            connections.close_all()
