"""The health of provider endpoints, in Redis. An endpoint is a (provider, model) pair.

A run that ends on a ProviderError (the provider's own retries spent) counts one failure of its
endpoint; a run that ends otherwise resets the count (at most once per `SUCCESS_EVERY_S` per
process and endpoint: the count is of failures in a row, and a busy worker ending a run every
few milliseconds should not pay a round trip for each). The autopilot's healing reads
`endpoints_failing` and marks an endpoint down for a while (`endpoint_mark_down`); routing
(`psychonauts.services.execute`) skips a model that is down.

Keys: one hash of failure counts (`endpoints:failures`, field `provider|model`) so the healing
reads all of them in one round trip, and one key per endpoint that is down, expiring by itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.utils import timezone

from core.redis import get_redis

logger = logging.getLogger(__name__)

FAILURES_KEY = "endpoints:failures"
DOWN_PREFIX = "endpoints:down:"
SUCCESS_EVERY_S = 10.0

# When this process last reset an endpoint's count, by endpoint: a failure seen here forgets it.
_reset_at: dict[str, float] = {}


@dataclass(frozen=True)
class EndpointHealth:
    provider: str
    model: str
    failures: int
    down_until: datetime | None  # None: not marked down
    reason: str = ""  # why it was marked down


def _field(provider: str, model: str) -> str:
    return f"{provider}|{model}"


def endpoint_failure(provider: str, model: str) -> int:
    """Count one more failure in a row of the endpoint; returns the count (0 when Redis could
    not count it: bookkeeping never fails the run that reports it)."""
    field = _field(provider, model)
    _reset_at.pop(field, None)
    try:
        return int(get_redis().hincrby(FAILURES_KEY, field, 1))
    except redis.RedisError:
        logger.warning("could not count a failure of endpoint %s", field, exc_info=True)
        return 0


def endpoint_success(provider: str, model: str) -> None:
    """The endpoint answered: its failures in a row start again from zero."""
    field = _field(provider, model)
    now = time.monotonic()
    if now - _reset_at.get(field, -SUCCESS_EVERY_S) < SUCCESS_EVERY_S:
        return
    try:
        get_redis().hdel(FAILURES_KEY, field)
    except redis.RedisError:
        logger.warning("could not reset the failures of endpoint %s", field, exc_info=True)
        return
    _reset_at[field] = now


def endpoint_mark_down(*, provider: str, model: str, reason: str, ttl_s: float) -> None:
    """Routing skips the endpoint for `ttl_s` seconds; its failure count starts again."""
    field = _field(provider, model)
    pipe = get_redis().pipeline(transaction=True)
    pipe.set(DOWN_PREFIX + field, reason[:500] or "down", px=max(1, int(ttl_s * 1000)))
    pipe.hdel(FAILURES_KEY, field)
    pipe.execute()
    _reset_at.pop(field, None)


def endpoint_down(provider: str, model: str) -> bool:
    return bool(get_redis().exists(DOWN_PREFIX + _field(provider, model)))


def endpoints_down(endpoints: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these endpoints are down, in one round trip (routing asks about every tier)."""
    if not endpoints:
        return set()
    found = get_redis().mget([DOWN_PREFIX + _field(p, m) for p, m in endpoints])
    return {e for e, value in zip(endpoints, found, strict=True) if value is not None}


def endpoints_failing() -> list[EndpointHealth]:
    """Endpoints with at least AUTOPILOT_ENDPOINT_FAILURES failures in a row, most first, and
    whether (until when) each is already down."""
    threshold = getattr(settings, "AUTOPILOT_ENDPOINT_FAILURES", 3)
    client = get_redis()
    counts: dict[str, int] = {
        str(field): int(count)
        for field, count in client.hgetall(FAILURES_KEY).items()
        if int(count) >= threshold
    }
    if not counts:
        return []
    fields = sorted(counts, key=lambda f: (-counts[f], f))
    pipe = client.pipeline(transaction=False)
    for field in fields:
        pipe.get(DOWN_PREFIX + field)
        pipe.pttl(DOWN_PREFIX + field)
    answers = pipe.execute()
    now = timezone.now()
    health = []
    for i, field in enumerate(fields):
        reason, ttl_ms = answers[2 * i], answers[2 * i + 1]
        provider, _, model = field.partition("|")
        down = reason is not None and ttl_ms > 0
        health.append(
            EndpointHealth(
                provider=provider,
                model=model,
                failures=counts[field],
                down_until=now + timedelta(milliseconds=ttl_ms) if down else None,
                reason=reason or "",
            )
        )
    return health
