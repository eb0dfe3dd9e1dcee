"""Token-bucket rate limits in Redis, shared by every process (web, workers) and any app.

A bucket holds up to `capacity` tokens and gains `capacity / period_s` tokens a second; each
request takes `cost` tokens or is refused with the time until it could pass. One Lua script
reads, refills and takes in a single atomic step, on the Redis server's own clock, so concurrent
requests from many processes never both spend the last token and no process clock skews it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, wraps
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from redis.commands.core import Script

from core.redis import get_redis
from core.security import client_address

logger = logging.getLogger(__name__)

KEY_PREFIX = "ratelimit:"

# KEYS[1]: the bucket (a hash of tokens and the time they were counted, in microseconds).
# ARGV: capacity, refill per second, cost. Returns {allowed 0|1, tokens left (floor),
# microseconds until `cost` tokens are there (0 when allowed)}. The key expires once a full
# bucket would have refilled, so idle clients leave nothing behind.
_TAKE = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = capacity
  at = now
end
local elapsed = math.max(0, now - at)
tokens = math.min(capacity, tokens + elapsed * rate / 1000000)
local allowed = 0
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait = math.ceil((cost - tokens) * 1000000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
return {allowed, math.floor(tokens), wait}
"""


@cache
def _take_script() -> Script:
    """The script, sent once per process and then called by its SHA (EVALSHA)."""
    return get_redis().register_script(_TAKE)


class RateLimitError(Exception):
    """Base of the rate limiter's errors."""


class InvalidRate(RateLimitError):
    """A rate that cannot work: a capacity or period below 1, a cost above the capacity."""


@dataclass(frozen=True)
class Rate:
    """`capacity` requests at once, refilled evenly over `period_s` seconds."""

    capacity: int
    period_s: float

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise InvalidRate(f"capacity must be at least 1, not {self.capacity}")
        if self.period_s <= 0:
            raise InvalidRate(f"period must be positive, not {self.period_s}")

    @property
    def per_second(self) -> float:
        return self.capacity / self.period_s


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: int  # whole tokens left after this request
    retry_after_s: float  # 0 when allowed

    @property
    def retry_after_header(self) -> str:
        """Retry-After in whole seconds, at least 1 (a refused client must wait)."""
        return str(max(1, math.ceil(self.retry_after_s)))


def rate_take(*, key: str, rate: Rate, cost: int = 1) -> Decision:
    """Take `cost` tokens from bucket `key`. Redis down: the request passes (a limiter must not
    take the service down with it) and it is logged."""
    if cost < 1 or cost > rate.capacity:
        raise InvalidRate(f"cost must be between 1 and the capacity {rate.capacity}, not {cost}")
    try:
        allowed, remaining, wait_us = _take_script()(
            keys=[KEY_PREFIX + key], args=[rate.capacity, repr(rate.per_second), cost]
        )
    except redis.RedisError:
        logger.warning("rate limit %s not checked: Redis unavailable", key, exc_info=True)
        return Decision(allowed=True, remaining=rate.capacity, retry_after_s=0.0)
    return Decision(
        allowed=bool(int(allowed)), remaining=int(remaining), retry_after_s=int(wait_us) / 1e6
    )


def rate_reset(*, key: str) -> None:
    """Forget bucket `key` (it starts full again)."""
    get_redis().delete(KEY_PREFIX + key)


def posts_limited(
    name: str, *, per_min_setting: str
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """Wrap a view so that its POSTs take a token from a bucket per client address (the setting
    `per_min_setting` a minute); an empty bucket answers 429 with Retry-After before the view
    runs. Used on the login views: each attempt costs a token, right password or not."""

    def decorate(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method == "POST":
                per_min = int(getattr(settings, per_min_setting))
                address = client_address(request) or "unknown"
                decision = rate_take(
                    key=f"{name}:{address}", rate=Rate(capacity=per_min, period_s=60)
                )
                if not decision.allowed:
                    response = HttpResponse(
                        f"Too many attempts from this address; retry in"
                        f" {decision.retry_after_header} s.\n",
                        status=429,
                        content_type="text/plain; charset=utf-8",
                    )
                    response["Retry-After"] = decision.retry_after_header
                    return response
            return view(request, *args, **kwargs)

        return wrapped

    return decorate
