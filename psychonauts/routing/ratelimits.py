"""Rate limits absorbed: an endpoint that answers 429 or 529 gets fewer calls at once.

Each registry endpoint has a concurrency in Redis (`endpoints:limit:<name>`, a float), shared
by every worker, at most its registered max_concurrency: a call holds one of `endpoint_limit`
slots. A rate-limited answer halves it (never under 1); each call that succeeds adds 1/limit
(one slot more per `limit` good calls: additive increase, multiplicative decrease). The key
expires ANNIHILATION_ENDPOINTS_LIMIT_MEMORY_S after the last change: an endpoint quiet that long
is back at its registered concurrency.

The call that was refused waits out the server's `retry-after` (or a back-off when it gives
none) without holding a slot, then queues again; the request is the same one, so nothing the
agent did is repeated. A wait longer than ENDPOINTS_RETRY_AFTER_MAX_S is not spent in the worker:
the run is suspended (RateLimitWait; its turns so far are checkpointed, the refused call had no
answer to keep) and holds no worker slot until the wait is over. Its wake-up is kept in Redis
(`ratelimits:resume`, a sorted set of run ids scored by when they are due) and sent as a Celery
task counting down the wait; the beat (`psychonauts.rate_limited_resume`) wakes whatever a lost
task left due. A run suspended more than ENDPOINTS_RATE_LIMIT_TRIES times ends in error.

Every endpoint a run calls is handled so: a registry endpoint under its name, and the endpoint
of a provider's own settings (`--provider anthropic` with ANTHROPIC_BASE_URL and its key, the
openai provider with OPENAI_BASE_URL) under a name made of the provider and its URL
(`psychonauts.routing.endpoints.settings_endpoint`).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from bursts.services.resume import agent_resume
from core.celery import app
from core.redis import get_redis
from psychonauts.errors import ProviderError

logger = logging.getLogger(__name__)

LIMIT_PREFIX = "endpoints:limit:"
RESUME_KEY = "ratelimits:resume"
SUSPENSIONS_PREFIX = "ratelimits:suspensions:"
RESUME_TASK = "psychonauts.rate_limited_resume"
SUSPENSIONS_MEMORY_S = 86_400

# KEYS: the limit. ARGV: max, memory_ms, calls in flight. Halves the limit; returns it. Unset
# (not lowered yet), it starts from the calls that were in flight when the endpoint refused,
# when fewer than the max: what the endpoint did not bear.
_DECREASE = """
local v = tonumber(redis.call('GET', KEYS[1]))
if not v then v = math.min(tonumber(ARGV[1]), tonumber(ARGV[3])) end
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

# KEYS: the wake-ups. ARGV: run id, its score when read. Removes it if still at that score.
_FORGET = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
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


def endpoint_rate_limited(name: str, maximum: int, *, in_flight: int | None = None) -> float:
    """Halve the endpoint's concurrency (from `in_flight`, the calls it had at once when it
    refused, when that is under the one in force); returns the new one."""
    start = maximum if in_flight is None else max(1, in_flight)
    return float(get_redis().eval(_DECREASE, 1, LIMIT_PREFIX + name, maximum, _memory_ms(), start))


def endpoint_call_succeeded(name: str, maximum: int) -> None:
    get_redis().eval(_INCREASE, 1, LIMIT_PREFIX + name, maximum, _memory_ms())


def retry_after_s(headers: Any) -> float | None:
    """The wait a refusal's headers ask for (any mapping with `get`: httpx's, http.client's):
    `retry-after-ms`, else `retry-after` in seconds; None when they give neither as a number."""
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return float(headers.get(header) or "") * scale
        except ValueError:
            continue
    return None


def rate_limit_wait(exc: ProviderError, *, attempt: int) -> float | None:
    """How long to wait before asking again when `exc` is the endpoint refusing for load (HTTP
    429 or 529, or an overloaded error in the stream): its `retry-after` when it gives one, else
    an exponential back-off with jitter (at most ENDPOINTS_RETRY_AFTER_MAX_S). A `retry-after`
    is honoured up to ENDPOINTS_RETRY_AFTER_LONGEST_S; past ENDPOINTS_RETRY_AFTER_MAX_S the
    caller suspends the run rather than wait in the worker. None for any other failure."""
    cause = exc.__cause__
    status = getattr(cause, "status_code", None)
    body = getattr(cause, "body", None)
    kind = ""
    if isinstance(body, dict):
        error = body.get("error")
        kind = str(error.get("type", "")) if isinstance(error, dict) else ""
    if status not in _RATE_LIMITED_STATUS and kind not in _RATE_LIMITED_TYPES:
        return None
    headers = getattr(getattr(cause, "response", None), "headers", None)
    wait = retry_after_s(headers) if headers is not None else None
    if wait is None or wait < 0:
        wait = settings.PSYCHONAUTS_RETRY_BASE_S * 2 ** (attempt - 1) * (0.5 + random.random() / 2)
        return float(min(wait, settings.ENDPOINTS_RETRY_AFTER_MAX_S))
    return float(min(wait, settings.ENDPOINTS_RETRY_AFTER_LONGEST_S))


def rate_limit_suspensions(agent_run_id: int) -> int:
    """Count one more suspension of the run for rate limits; returns how many it had (a day's
    memory: a run is not suspended for rate limits longer than that)."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.incr(SUSPENSIONS_PREFIX + str(agent_run_id))
    pipe.expire(SUSPENSIONS_PREFIX + str(agent_run_id), SUSPENSIONS_MEMORY_S)
    count, _ = pipe.execute()
    return int(count)


def rate_limit_resume_schedule(*, agent_run_id: int, wait_s: float) -> None:
    """Wake the run (suspended: waiting) once `wait_s` has passed: kept in Redis for the beat,
    and sent as a task counting the wait down."""
    get_redis().zadd(RESUME_KEY, {str(agent_run_id): time.time() + wait_s})
    app.send_task(RESUME_TASK, args=(agent_run_id,), countdown=wait_s)


def rate_limit_resume_due(*, agent_run_id: int | None = None) -> list[int]:
    """Wake the runs whose rate-limit wait is over (only `agent_run_id`, when given); returns
    those woken. agent_resume is a compare-and-set: a run woken twice (the task and the beat), or
    ended meanwhile, is woken at most once; either way it leaves the set."""
    client = get_redis()
    now = time.time()
    due: list[tuple[str, float]]
    if agent_run_id is not None:
        score = client.zscore(RESUME_KEY, str(agent_run_id))
        due = [(str(agent_run_id), score)] if score is not None and score <= now else []
    else:
        found: list[Any] = client.zrangebyscore(
            RESUME_KEY, "-inf", now, start=0, num=500, withscores=True
        )
        due = [(str(member), float(score)) for member, score in found]
    woken = []
    for member, score in due:
        with transaction.atomic():
            if agent_resume(agent_run_id=int(member)):
                woken.append(int(member))
        # Only the wake-up seen: the resumed run may have been refused again and rescheduled.
        client.eval(_FORGET, 1, RESUME_KEY, member, repr(score))
    if woken:
        logger.info("rate limits: woke %d runs whose wait was over", len(woken))
    return woken


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
