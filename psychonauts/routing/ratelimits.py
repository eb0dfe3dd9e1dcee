"""Rate limits absorbed: an endpoint that answers 429 or 529 gets fewer calls at once.

Each registry endpoint has a concurrency in Redis (`endpoints:limit:<name>`, a float), shared
by every worker, at most its registered max_concurrency: a call holds one of `endpoint_limit`
slots. A rate-limited answer halves it (never under 1); each call that succeeds adds 1/limit
(one slot more per `limit` good calls: additive increase, multiplicative decrease). The key
expires ANNIHILATION_ENDPOINTS_LIMIT_MEMORY_S after the last change: an endpoint quiet that long
is back at its registered concurrency.

The call that was refused waits out the server's `retry-after` (or a back-off when it gives
none) without holding a slot, then queues again; the request is the same one, so nothing the
agent did is repeated.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

from django.conf import settings

from core.redis import get_redis
from psychonauts.errors import ProviderError

LIMIT_PREFIX = "endpoints:limit:"

# KEYS: the limit. ARGV: max, memory_ms. Halves the limit (from max when unset); returns it.
_DECREASE = """
local v = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
v = math.max(1, v / 2)
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return tostring(v)
"""

# KEYS: the limit. ARGV: max, memory_ms. Adds 1/limit when set (unset: already at max).
_INCREASE = """
local v = tonumber(redis.call('GET', KEYS[1]))
if not v then return nil end
v = v + 1 / v
if v >= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return nil
end
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return tostring(v)
"""

_RATE_LIMITED_STATUS = frozenset({429, 529})
_RATE_LIMITED_TYPES = frozenset({"rate_limit_error", "overloaded_error"})


def _memory_ms() -> int:
    return int(settings.ENDPOINTS_LIMIT_MEMORY_S * 1000)


def endpoint_limit(name: str, maximum: int) -> int:
    """The endpoint's concurrency now: `maximum` unless rate limits lowered it."""
    value = get_redis().get(LIMIT_PREFIX + name)
    if value is None:
        return maximum
    return max(1, min(maximum, math.floor(float(value))))


def endpoint_rate_limited(name: str, maximum: int) -> float:
    """Halve the endpoint's concurrency; returns the new one."""
    return float(get_redis().eval(_DECREASE, 1, LIMIT_PREFIX + name, maximum, _memory_ms()))


def endpoint_call_succeeded(name: str, maximum: int) -> None:
    get_redis().eval(_INCREASE, 1, LIMIT_PREFIX + name, maximum, _memory_ms())


def rate_limit_wait(exc: ProviderError, *, attempt: int) -> float | None:
    """How long to wait before asking again when `exc` is the endpoint refusing for load (HTTP
    429 or 529, or an overloaded error in the stream): its `retry-after` when it gives one, else
    an exponential back-off with jitter; capped at ENDPOINTS_RETRY_AFTER_MAX_S. None for any
    other failure."""
    cause = exc.__cause__
    status = getattr(cause, "status_code", None)
    body = getattr(cause, "body", None)
    kind = ""
    if isinstance(body, dict):
        error = body.get("error")
        kind = str(error.get("type", "")) if isinstance(error, dict) else ""
    if status not in _RATE_LIMITED_STATUS and kind not in _RATE_LIMITED_TYPES:
        return None
    wait = None
    response = getattr(cause, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None:
        for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                wait = float(headers.get(header, "")) * scale
                break
            except ValueError:
                continue
    if wait is None or wait < 0:
        wait = settings.PSYCHONAUTS_RETRY_BASE_S * 2 ** (attempt - 1) * (0.5 + random.random() / 2)
    return min(wait, settings.ENDPOINTS_RETRY_AFTER_MAX_S)


@functools.cache
def _openai_client_class() -> type[Any]:
    import openai

    class EndpointOpenAI(openai.OpenAI):
        """The SDK's client, except that a 429 or 529 is not retried inside the call (which
        would hold the endpoint's slot while it waits): the caller waits it out."""

        def _should_retry(self, response: Any) -> bool:
            if response.status_code in _RATE_LIMITED_STATUS:
                return False
            return bool(super()._should_retry(response))

    return EndpointOpenAI


def openai_endpoint_client(*, base_url: str, api_key: str, timeout_s: float) -> Any:
    """An OpenAI client for a registry endpoint (see `_openai_client_class`), configured as
    `providers.openai.client_for` configures the process's shared ones."""
    import httpx2

    from psychonauts.routing.providers.openai import NO_KEY

    return _openai_client_class()(
        base_url=base_url or None,
        api_key=api_key or NO_KEY,
        max_retries=max(0, settings.PSYCHONAUTS_PROVIDER_RETRIES - 1),
        timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
    )
