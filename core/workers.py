"""Is anybody there? The Celery workers that answer now, the hosts they run on, and what to say
when none does.

Work sent with nobody to consume it waits silently in the broker: `start_wave`, the dashboard
and the alerter ask the workers with a broadcast and a short timeout (a ping costs the whole
timeout when nobody answers, so callers ask only when work is waiting, and the dashboard reads
an answer cached for a few seconds).

Which host each worker runs on is known without asking: every worker notes itself in Redis
with each Celery heartbeat (every 2 s), under its node name and its ANNIHILATION_HOST
(`workers_by_host`). An agent run's `worker` names its host the same way (`worker_name`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any

import redis
from celery.signals import heartbeat_sent, worker_shutdown
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

SEEN_KEY = "workers:seen"  # hash: a worker's node name -> {"host": ..., "at": epoch seconds}
# A worker not heard from for that long is gone (it notes itself every 2 s); its entry is
# dropped by the next reader once it is older than SEEN_FORGET_S.
SEEN_TTL_S = 10.0
SEEN_FORGET_S = 3600.0


def worker_name() -> str:
    """This process and thread as an agent run's `worker`: `<host>:<pid>:<thread>`, the host
    first (`worker_host`)."""
    return f"{settings.ANNIHILATION_HOST}:{os.getpid()}:{threading.current_thread().name}"


def worker_host(worker: str) -> str:
    """The host of an agent run's `worker` ("" for none): what comes before its first colon (a
    host name has none)."""
    return worker.partition(":")[0]


def worker_seen(*, node: str, host: str, now: float) -> None:
    """Note that the Celery worker `node`, on `host`, is alive at `now` (epoch seconds)."""
    get_redis().hset(SEEN_KEY, node, json.dumps({"host": host, "at": now}))


def worker_gone(*, node: str) -> None:
    get_redis().hdel(SEEN_KEY, node)


def workers_by_host(*, now: float | None = None) -> dict[str, list[str]]:
    """The node names of the workers heard from in the last SEEN_TTL_S seconds, by host (empty
    when Redis cannot be read)."""
    now = time.time() if now is None else now
    client = get_redis()
    try:
        seen = {str(k): str(v) for k, v in client.hgetall(SEEN_KEY).items()}
    except redis.RedisError:
        logger.warning("could not read the workers' hosts", exc_info=True)
        return {}
    hosts: dict[str, list[str]] = {}
    forgotten = []
    for node, raw in sorted(seen.items()):
        entry = json.loads(raw)
        age = now - float(entry["at"])
        if age <= SEEN_TTL_S:
            hosts.setdefault(str(entry["host"]), []).append(node)
        elif age > SEEN_FORGET_S:
            forgotten.append(node)
    if forgotten:
        with contextlib.suppress(redis.RedisError):
            client.hdel(SEEN_KEY, *forgotten)
    return hosts


@heartbeat_sent.connect
def _heartbeat(sender: Any, **_: Any) -> None:
    """Celery's heartbeat (the worker's event loop, every 2 s): one HSET. A Redis that cannot be
    reached only leaves the worker unlisted until it can."""
    try:
        worker_seen(node=sender.eventer.hostname, host=settings.ANNIHILATION_HOST, now=time.time())
    except redis.RedisError:
        logger.debug("could not note this worker's host", exc_info=True)


@worker_shutdown.connect
def _shutdown(sender: Any, **_: Any) -> None:
    """A worker stopping leaves the list at once (its last heartbeat, `worker-offline`, noted it
    just before)."""
    with contextlib.suppress(redis.RedisError):
        worker_gone(node=sender.hostname)
