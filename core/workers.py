"""Is anybody there? The Celery workers that answer now, the hosts they run on, and what to say
when none does.

Work sent with nobody to consume it waits silently in the broker: `start_wave` and the
alerter ask the workers with a broadcast and a short timeout (a ping costs the whole timeout
when nobody answers, so callers ask only when work is waiting).

Which host each worker runs on, and which queues it consumes, is known without asking: every
worker notes itself in Redis with each Celery heartbeat (every 2 s), under its node name, with
its ANNIHILATION_HOST and its queues (`workers_seen`). The dashboard reads that note, so a render
never waits on a broadcast. An agent run's `worker` names its host the same way (`worker_name`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any, TypedDict

import redis
from celery.signals import heartbeat_sent, worker_ready, worker_shutdown
from django.conf import settings

from core.redis import get_redis

logger = logging.getLogger(__name__)

NO_WORKER_HINT = (
    "start one with `make dev` (web, worker and beat together), or in another terminal: "
    "`.venv/bin/celery -A annihilation worker -B -P threads -c 16 -l info`"
)
CACHE_KEY = "operations:workers"
CACHE_TTL_S = 10


def workers_consuming(
    *, timeout: float | None = None, limit: int | None = None
) -> dict[str, list[str]]:
    """The workers that answered within `timeout` seconds and the queues each consumes
    (empty when none answered or the broker is unreachable). With `limit`, the answer comes
    as soon as that many workers replied (the whole timeout is spent only when fewer do)."""
    from core.celery import app

    wait = settings.OPERATIONS_PING_TIMEOUT_S if timeout is None else timeout
    try:
        replies = app.control.inspect(timeout=wait, limit=limit).active_queues() or {}
    except Exception:  # the broker is down: nobody can be reached either
        logger.warning("could not ask the workers (broker unreachable?)", exc_info=True)
        return {}
    return {
        str(name): sorted(str(q.get("name", "")) for q in (queues or []))
        for name, queues in replies.items()
    }


def workers_consuming_cached(*, timeout: float | None = None) -> dict[str, list[str]]:
    """`workers_consuming`, answered from a Redis copy at most CACHE_TTL_S old."""
    client = get_redis()
    try:
        cached = client.get(CACHE_KEY)
    except redis.RedisError:
        cached = None
    if cached is not None:
        found: dict[str, list[str]] = json.loads(cached)
        return found
    found = workers_consuming(timeout=timeout)
    with contextlib.suppress(redis.RedisError):
        client.set(CACHE_KEY, json.dumps(found), ex=CACHE_TTL_S)
    return found


# --- hosts ---------------------------------------------------------------------------------

SEEN_KEY = "workers:seen"  # hash: node name -> {"host": ..., "at": epoch seconds, "queues": [...]}
# A worker not heard from for that long is gone (it notes itself every 2 s); its entry is
# dropped by the next reader once it is older than SEEN_FORGET_S.
SEEN_TTL_S = 10.0
SEEN_FORGET_S = 3600.0


class WorkerSeen(TypedDict):
    host: str
    # The queues it consumes; None when its note does not say (a worker whose consumer had not
    # started yet).
    queues: list[str] | None


def worker_name() -> str:
    """This process and thread as an agent run's `worker`: `<host>:<pid>:<thread>`, the host
    first (`worker_host`)."""
    return f"{settings.ANNIHILATION_HOST}:{os.getpid()}:{threading.current_thread().name}"


def worker_host(worker: str) -> str:
    """The host of an agent run's `worker` ("" for none): what comes before its first colon (a
    host name has none)."""
    return worker.partition(":")[0]


def worker_seen(*, node: str, host: str, now: float, queues: list[str] | None = None) -> None:
    """Note that the Celery worker `node`, on `host` and consuming `queues`, is alive at `now`
    (epoch seconds)."""
    get_redis().hset(SEEN_KEY, node, json.dumps({"host": host, "at": now, "queues": queues}))


def worker_gone(*, node: str) -> None:
    get_redis().hdel(SEEN_KEY, node)


def workers_seen(*, now: float | None = None) -> dict[str, WorkerSeen]:
    """The workers heard from in the last SEEN_TTL_S seconds, by node name (empty when Redis
    cannot be read). One HGETALL: no worker is asked."""
    now = time.time() if now is None else now
    client = get_redis()
    try:
        seen = {str(k): str(v) for k, v in client.hgetall(SEEN_KEY).items()}
    except redis.RedisError:
        logger.warning("could not read the workers' notes", exc_info=True)
        return {}
    alive: dict[str, WorkerSeen] = {}
    forgotten = []
    for node, raw in sorted(seen.items()):
        entry = json.loads(raw)
        age = now - float(entry["at"])
        if age <= SEEN_TTL_S:
            queues = entry.get("queues")
            alive[node] = {
                "host": str(entry["host"]),
                "queues": None if queues is None else [str(q) for q in queues],
            }
        elif age > SEEN_FORGET_S:
            forgotten.append(node)
    if forgotten:
        with contextlib.suppress(redis.RedisError):
            client.hdel(SEEN_KEY, *forgotten)
    return alive


def workers_by_host(*, now: float | None = None) -> dict[str, list[str]]:
    """The node names of the workers heard from in the last SEEN_TTL_S seconds, by host."""
    hosts: dict[str, list[str]] = {}
    for node, entry in workers_seen(now=now).items():
        hosts.setdefault(entry["host"], []).append(node)
    return hosts


def workers_consuming_seen() -> dict[str, list[str]]:
    """`workers_consuming` as the workers' heartbeat notes tell it, without asking them. A
    worker that sends no heartbeat (started `--without-heartbeat --without-gossip`) leaves no
    note: when no worker is heard from, or a note does not name its queues, the workers are
    asked after all (`workers_consuming_cached`)."""
    seen = workers_seen()
    if not seen or any(entry["queues"] is None for entry in seen.values()):
        return workers_consuming_cached()
    return {node: sorted(entry["queues"] or []) for node, entry in seen.items()}


# The consumer of this worker process, once it is ready: its heartbeat names its queues.
_consumer: Any = None


@worker_ready.connect
def _ready(sender: Any, **_: Any) -> None:
    global _consumer
    _consumer = sender


def _queues_consumed() -> list[str] | None:
    """The queues this worker consumes now (a control command may add or cancel one)."""
    task_consumer = getattr(_consumer, "task_consumer", None)
    if task_consumer is None:
        return None
    return sorted(str(q.name) for q in task_consumer.queues)


@heartbeat_sent.connect
def _heartbeat(sender: Any, **_: Any) -> None:
    """Celery's heartbeat (the worker's event loop, every 2 s): one HSET. A Redis that cannot be
    reached only leaves the worker unlisted until it can."""
    try:
        worker_seen(
            node=sender.eventer.hostname,
            host=settings.ANNIHILATION_HOST,
            now=time.time(),
            queues=_queues_consumed(),
        )
    except redis.RedisError:
        logger.debug("could not note this worker's host", exc_info=True)


@worker_shutdown.connect
def _shutdown(sender: Any, **_: Any) -> None:
    """A worker stopping leaves the list at once (its last heartbeat, `worker-offline`, noted it
    just before)."""
    with contextlib.suppress(redis.RedisError):
        worker_gone(node=sender.hostname)
