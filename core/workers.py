"""Is anybody there? The Celery workers that answer now, and what to say when none does.

Work sent with nobody to consume it waits silently in the broker: `start_wave`, the dashboard
and the alerter ask the workers with a broadcast and a short timeout (a ping costs the whole
timeout when nobody answers, so callers ask only when work is waiting, and the dashboard reads
an answer cached for a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import logging

import redis
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
