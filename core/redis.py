"""The one Redis connection pool of a process (hot state: leases, registry, queues)."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
