"""The question queue in Redis: one sorted set of pending reaching ids.

The score orders critical > high > normal > low, then the earliest deadline. Postgres holds the
truth; the set is a fast ordered view rebuilt from the pending reachings whenever its marker key
is missing (Redis restarted without its data, FLUSHALL), so losing Redis loses nothing. Members
that are no longer pending are dropped lazily by whoever reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

import redis

from core.redis import get_redis
from tether.models import PRIORITY_RANK, Reaching, ReachingStatus

logger = logging.getLogger(__name__)

KEY = "tether:queue"
MARKER = "tether:queue:built"
# Deadlines as epoch seconds stay below 1e10 until the year 2286: the rank dominates.
_RANK_WEIGHT = 1e10


def queue_score(priority: str, deadline: datetime) -> float:
    return PRIORITY_RANK.get(priority, 2) * _RANK_WEIGHT + deadline.timestamp()


def queue_rebuild(client: redis.Redis | None = None) -> int:
    """Add every pending reaching (never deleting first: a concurrent push is never lost)."""
    client = client or get_redis()
    rows = list(
        Reaching.objects.filter(status=ReachingStatus.PENDING).values_list(
            "pk", "priority", "deadline"
        )
    )
    pipe = client.pipeline(transaction=True)
    if rows:
        pipe.zadd(
            KEY, {str(pk): queue_score(priority, deadline) for pk, priority, deadline in rows}
        )
    pipe.set(MARKER, "1")
    pipe.execute()
    return len(rows)


def queue_ensure(client: redis.Redis | None = None) -> redis.Redis:
    client = client or get_redis()
    if not client.exists(MARKER):
        logger.warning("tether: question queue missing in Redis; rebuilding from Postgres")
        queue_rebuild(client)
    return client


def queue_push_unsafe(reaching_id: int, priority: str, deadline: datetime) -> None:
    """Add a reaching now (hence `unsafe`: after commit). Redis down: logged; the sweep rebuilds."""
    try:
        client = queue_ensure()
        client.zadd(KEY, {str(reaching_id): queue_score(priority, deadline)})
    except redis.RedisError:
        logger.warning("tether: could not queue reaching %s in Redis", reaching_id, exc_info=True)


def queue_remove_unsafe(reaching_ids: Iterable[int]) -> None:
    ids = [str(i) for i in reaching_ids]
    if not ids:
        return
    try:
        get_redis().zrem(KEY, *ids)
    except redis.RedisError:
        logger.warning("tether: could not unqueue reachings %s", ids, exc_info=True)


def queue_ids(limit: int = 1000) -> list[int]:
    """Pending reaching ids in queue order (the set may hold a few stale ids: callers filter)."""
    client = queue_ensure()
    return [int(m) for m in client.zrange(KEY, 0, limit - 1)]  # type: ignore[arg-type]


def queue_check() -> bool:
    """Rebuild when the set has fewer members than Postgres has pending reachings (a push lost
    while Redis was unreachable). Returns True when it rebuilt."""
    client = queue_ensure()
    pending = Reaching.objects.filter(status=ReachingStatus.PENDING).count()
    if client.zcard(KEY) < pending:
        queue_rebuild(client)
        return True
    return False
