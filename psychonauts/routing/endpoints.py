"""Model endpoints: their health in Redis, and the registry of endpoints routing picks from.

Health. An endpoint's health is kept under a (provider, model) pair: the model's name for the
models of PSYCHONAUTS_MODELS, the registry entry's name for an endpoint of the registry. A run
that ends on a ProviderError (the provider's own retries spent) counts one failure of its
endpoint; a run that ends otherwise resets the count (at most once per `SUCCESS_EVERY_S` per
process and endpoint: the count is of failures in a row, and a busy worker ending a run every
few milliseconds should not pay a round trip for each). The autopilot's healing reads
`endpoints_failing` and marks an endpoint down for a while (`endpoint_mark_down`); the health
beat (`endpoints_health_check`) marks each registry endpoint down or up by what a cheap call to
it answers; routing (`psychonauts.runtime.execute`) skips an endpoint that is down.

Keys: one hash of failure counts (`endpoints:failures`, field `provider|model`) so the healing
reads all of them in one round trip, one key per endpoint that is down, expiring by itself, and
one counting semaphore per registry endpoint (`endpoints:slots:<name>`, see
`psychonauts.routing.semaphore`): its model calls in flight across every worker.

Registry. The `Endpoint` rows (written here only), read through a per-process snapshot kept
ENDPOINTS_CACHE_S seconds: routing asks on every run and prices on every call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from pydantic import BaseModel

from core import metrics
from core.destinations import DestinationRefused, destination_check
from core.redaction import redact
from core.redis import get_redis
from psychonauts.errors import (
    CallPastDeadline,
    ProviderError,
    PsychonautError,
    RateLimitWait,
    SlotTimeout,
)
from psychonauts.models import Endpoint, EndpointProvider, HealthStatus
from psychonauts.routing.providers.base import OnText, Provider, ProviderRequest, ProviderResponse
from psychonauts.routing.ratelimits import (
    endpoint_call_succeeded,
    endpoint_limit,
    endpoint_rate_limited,
    openai_endpoint_client,
    rate_limit_suspensions,
    rate_limit_wait,
)
from psychonauts.routing.semaphore import slot_held, slots_in_use

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
    metrics.error("provider")
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


def endpoint_mark_up(*, provider: str, model: str) -> None:
    """The endpoint answers again: routing takes it, its failures in a row start from zero."""
    field = _field(provider, model)
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(DOWN_PREFIX + field)
    pipe.hdel(FAILURES_KEY, field)
    pipe.execute()
    _reset_at.pop(field, None)


# --- the registry -------------------------------------------------------------------------------

SLOTS_PREFIX = "endpoints:slots:"


@dataclass(frozen=True)
class EndpointConf:
    """An endpoint of the registry as routing and the providers see it (no key: its name)."""

    name: str
    provider: str
    model: str
    base_url: str
    api_key_env: str
    tier: str
    max_concurrency: int
    price: tuple[float, float] | None  # USD per million tokens in, out; None: the settings'
    enabled: bool = True
    context_tokens: int | None = None  # the model's context size; None: not bounded here
    text_tool_calls: bool = False  # tool calls written as text are parsed as calls
    # The endpoint of a provider's own settings (`settings_endpoint`), not a registry row: its
    # URL and key are the operator's environment, not checked as a registry endpoint's are.
    from_settings: bool = False

    @property
    def health_key(self) -> tuple[str, str]:
        return (self.provider, self.name)

    @property
    def slots_key(self) -> str:
        return SLOTS_PREFIX + self.name

    def api_key(self) -> str | None:
        """The key from the environment variable the registry names (None: no variable named)."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env, "")


def _conf(row: Endpoint) -> EndpointConf:
    price = None
    if row.usd_per_mtok_in is not None or row.usd_per_mtok_out is not None:
        price = (float(row.usd_per_mtok_in or 0), float(row.usd_per_mtok_out or 0))
    return EndpointConf(
        name=row.name,
        provider=row.provider,
        model=row.model,
        base_url=row.base_url,
        api_key_env=row.api_key_env,
        tier=row.tier,
        max_concurrency=row.max_concurrency,
        price=price,
        enabled=row.enabled,
        context_tokens=row.context_tokens,
        text_tool_calls=row.text_tool_calls,
    )


_snapshot: tuple[float, tuple[EndpointConf, ...]] | None = None
_snapshot_lock = threading.Lock()


def registry_snapshot() -> tuple[EndpointConf, ...]:
    """Every endpoint of the registry, enabled or not, as this process last read it (at most
    ENDPOINTS_CACHE_S seconds ago)."""
    global _snapshot
    now = time.monotonic()
    taken = _snapshot
    if taken is not None and now - taken[0] < settings.ENDPOINTS_CACHE_S:
        return taken[1]
    confs = tuple(_conf(row) for row in Endpoint.objects.order_by("tier", "name"))
    with _snapshot_lock:
        _snapshot = (now, confs)
    return confs


def registry_invalidate() -> None:
    """The next snapshot reads the table again (this process's writes call it)."""
    global _snapshot
    with _snapshot_lock:
        _snapshot = None


def registry_enabled() -> tuple[EndpointConf, ...]:
    return tuple(c for c in registry_snapshot() if c.enabled)


def registry_price(model: str) -> tuple[float, float] | None:
    """The price an enabled endpoint of the registry gives `model` (the first with a price)."""
    for conf in registry_snapshot():
        if conf.model == model and conf.price is not None and conf.enabled:
            return conf.price
    return None


@dataclass(frozen=True)
class EndpointState:
    """What routing needs to know of an endpoint right now, read in one round trip."""

    conf: EndpointConf
    down: bool
    failures: int  # in a row
    in_flight: int  # model calls holding one of its slots

    @property
    def full(self) -> bool:
        return self.in_flight >= self.conf.max_concurrency


def endpoints_state(confs: tuple[EndpointConf, ...]) -> list[EndpointState]:
    """Down marks, failures in a row and calls in flight of these endpoints, in one pipeline."""
    if not confs:
        return []
    pipe = get_redis().pipeline(transaction=False)
    pipe.mget([DOWN_PREFIX + _field(*c.health_key) for c in confs])
    pipe.hmget(FAILURES_KEY, [_field(*c.health_key) for c in confs])
    for conf in confs:
        # The slots held, counting one whose holder died until the next acquire drops it: a
        # ranking can afford that, and needs no round trip for the server's clock.
        pipe.zcard(conf.slots_key)
    down, failures, *in_flight = pipe.execute()
    return [
        EndpointState(conf=c, down=d is not None, failures=int(f or 0), in_flight=int(n))
        for c, d, f, n in zip(confs, down, failures, in_flight, strict=True)
    ]


# --- writes ---------------------------------------------------------------------------------


class EndpointInvalid(PsychonautError):
    """An endpoint's fields are refused (the message names each field and why)."""


class EndpointNotFound(PsychonautError):
    """No endpoint of the registry has that name."""


class EndpointBusy(ProviderError):
    """Every slot of the endpoint stayed taken for ENDPOINTS_SLOT_WAIT_S: the call was not made."""


def endpoint_add(
    *,
    name: str,
    model: str,
    base_url: str = "",
    provider: str = EndpointProvider.OPENAI,
    api_key_env: str = "",
    tier: str = "standard",
    max_concurrency: int = 4,
    usd_per_mtok_in: Decimal | float | None = None,
    usd_per_mtok_out: Decimal | float | None = None,
    enabled: bool = True,
    context_tokens: int | None = None,
    text_tool_calls: bool = False,
) -> Endpoint:
    """Add an endpoint to the registry; EndpointInvalid (nothing written) when a field is
    refused, a key is given instead of a variable's name, the variable is not one endpoints may
    use, the URL is an internal address (`endpoint_destination_problem`), or the name is taken."""
    if "@" in base_url.partition("//")[2].partition("/")[0]:
        raise EndpointInvalid(
            "base_url: no credentials in the URL; name the environment variable holding the "
            "key with api_key_env"
        )
    row = Endpoint(
        name=name,
        model=model,
        base_url=base_url,
        provider=provider,
        api_key_env=api_key_env,
        tier=tier,
        max_concurrency=max_concurrency,
        usd_per_mtok_in=None if usd_per_mtok_in is None else Decimal(str(usd_per_mtok_in)),
        usd_per_mtok_out=None if usd_per_mtok_out is None else Decimal(str(usd_per_mtok_out)),
        enabled=enabled,
        context_tokens=context_tokens,
        text_tool_calls=text_tool_calls,
    )
    try:
        row.full_clean()
    except ValidationError as exc:
        raise EndpointInvalid(_messages(exc)) from None
    # Not resolved here (a model server's name may not resolve yet): each call checks again.
    problem = endpoint_destination_problem(base_url, api_key_env, resolve=False)
    if problem is not None:
        raise EndpointInvalid(problem)
    for price in (row.usd_per_mtok_in, row.usd_per_mtok_out):
        if price is not None and price < 0:
            raise EndpointInvalid("a price per million tokens cannot be negative")
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        raise EndpointInvalid(f"name: an endpoint named {name!r} exists") from None
    registry_invalidate()
    return row


def key_env_allowed(name: str) -> bool:
    """Whether an endpoint may name the environment variable `name` for its key
    (ENDPOINTS_KEY_ENVS: exact names, or prefixes ending in `*`)."""
    return any(
        name.startswith(allowed[:-1]) if allowed.endswith("*") else name == allowed
        for allowed in settings.ENDPOINTS_KEY_ENVS
    )


def endpoint_destination_problem(base_url: str, api_key_env: str, *, resolve: bool) -> str | None:
    """Why the worker may not send a key to `base_url` (core.destinations, with
    ENDPOINTS_ALLOW_PRIVATE), or read it from `api_key_env` (ENDPOINTS_KEY_ENVS); None when it
    may. A blank base_url is the SDK's own service."""
    if api_key_env and not key_env_allowed(api_key_env):
        return (
            f"api_key_env: {api_key_env} is not one of the variables endpoints may use "
            f"(ANNIHILATION_ENDPOINTS_KEY_ENVS: {', '.join(settings.ENDPOINTS_KEY_ENVS)})"
        )
    if not base_url:
        return None
    try:
        destination_check(
            base_url,
            allow_private=settings.ENDPOINTS_ALLOW_PRIVATE,
            setting="ANNIHILATION_ENDPOINTS_ALLOW_PRIVATE",
            resolve=resolve,
        )
    except DestinationRefused as exc:
        return f"base_url: {exc}"
    return None


class EndpointRefused(ProviderError):
    """The endpoint's URL or key variable is one the worker does not send a key to: the call was
    not made."""


def _messages(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{field}: {' '.join(m for e in errors for m in e.messages)}"
            for field, errors in exc.error_dict.items()
        )
    return "; ".join(exc.messages)


def endpoint_remove(*, name: str) -> None:
    """Remove an endpoint from the registry, its health marks and slots with it."""
    row = Endpoint.objects.filter(name=name).first()
    if row is None:
        raise EndpointNotFound(f"no endpoint named {name!r}")
    Endpoint.objects.filter(pk=row.pk).delete()
    field = _field(row.provider, row.name)
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(DOWN_PREFIX + field, SLOTS_PREFIX + row.name)
    pipe.hdel(FAILURES_KEY, field)
    pipe.execute()
    registry_invalidate()


def endpoint_health_record(
    *, name: str, up: bool, reason: str, now: datetime, was_down: bool = True
) -> bool:
    """Record a check's verdict: the row's health (compare-and-set from what it was, so two
    beats racing record one transition) and the Redis down mark routing reads. An endpoint that
    comes back (`was_down`) starts its failures in a row from zero; one that was up keeps them
    (a check's short answer does not show that long ones fail). Returns whether the health
    changed."""
    row = Endpoint.objects.filter(name=name).values("provider", "health").first()
    if row is None:
        return False
    provider, before = str(row["provider"]), str(row["health"])
    reason = redact(reason)[:500]
    if up:
        if was_down:
            endpoint_mark_up(provider=provider, model=name)
    else:
        endpoint_mark_down(
            provider=provider, model=name, reason=reason, ttl_s=settings.ENDPOINTS_DOWN_S
        )
    after = HealthStatus.UP if up else HealthStatus.DOWN
    changed = Endpoint.objects.filter(name=name, health=before).update(
        health=after, health_reason="" if up else reason, checked_at=now
    )
    if changed != 1:  # another check recorded first: its verdict stands, this one's time too
        Endpoint.objects.filter(name=name).update(checked_at=now)
        return False
    if before != after:
        log = logger.info if up else logger.warning
        log("endpoint %s is %s%s", name, after, f": {reason}" if reason and not up else "")
    return before != after


# --- calls to an endpoint -----------------------------------------------------------------------


_anthropic_clients: dict[tuple[str, str, float], Any] = {}
_openai_clients: dict[tuple[str, str, float], Any] = {}
_anthropic_lock = threading.Lock()


def _base_provider(conf: EndpointConf) -> Provider:
    """The endpoint's provider; its client (connection pool) is the process's one for the
    endpoint's URL, key and timeout, shared by the agent threads."""
    key = conf.api_key()
    timeout = float(settings.ENDPOINTS_TIMEOUT_S)
    if conf.provider == EndpointProvider.ANTHROPIC:
        import anthropic

        from psychonauts.routing.providers.anthropic import AnthropicProvider

        api_key = key if key is not None else os.environ.get("ANTHROPIC_API_KEY", "")
        with _anthropic_lock:
            client = _anthropic_clients.get((conf.base_url, api_key, timeout))
            if client is None:
                client = anthropic.Anthropic(
                    base_url=conf.base_url or None,
                    api_key=api_key,
                    max_retries=0,  # the provider's own retries
                    timeout=timeout,
                )
                _anthropic_clients[(conf.base_url, api_key, timeout)] = client
        return AnthropicProvider(client=client, rate_limits_to_caller=True)
    from psychonauts.routing.providers.openai import OpenAIProvider

    api_key = key if key is not None else os.environ.get("OPENAI_API_KEY", "")
    with _anthropic_lock:
        client = _openai_clients.get((conf.base_url, api_key, timeout))
        if client is None:
            client = openai_endpoint_client(
                base_url=conf.base_url, api_key=api_key, timeout_s=timeout
            )
            _openai_clients[(conf.base_url, api_key, timeout)] = client
    return OpenAIProvider(client=client, text_tool_calls=conf.text_tool_calls)


class LimitedProvider:
    """An endpoint's provider whose every call holds one of the endpoint's slots (at most
    max_concurrency calls at once across every worker, fewer while it rate-limits: see
    `psychonauts.routing.ratelimits`; a call waits up to ENDPOINTS_SLOT_WAIT_S for one, then fails with
    EndpointBusy). A call refused for load (429, 529) gives its slot back, waits, and queues
    again, up to ENDPOINTS_RATE_LIMIT_TRIES times; a wait longer than ENDPOINTS_RETRY_AFTER_MAX_S
    suspends the run instead (RateLimitWait), holding no worker until it is over."""

    uses_llm = True

    def __init__(self, conf: EndpointConf, provider: Provider) -> None:
        self.conf = conf
        self.inner = provider
        self.name = provider.name
        # The runner keeps each request within it (`psychonauts.runtime.context`).
        self.context_tokens = conf.context_tokens

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        conf = self.conf
        if not conf.from_settings:
            # Checked at each call: the name may resolve elsewhere now than when it was added.
            problem = endpoint_destination_problem(conf.base_url, conf.api_key_env, resolve=True)
            if problem is not None:
                raise EndpointRefused(f"endpoint {conf.name}: {problem}")
        holder = f"{request.run.agent_run_id}:{os.getpid()}:{threading.get_ident()}"
        attempt = 1
        while True:
            # A slot is waited for at most ENDPOINTS_SLOT_WAIT_S, and never past the run's time.
            wait_s, deadline_first = settings.ENDPOINTS_SLOT_WAIT_S, False
            left = request.time_left()
            if left is not None and left < wait_s:
                wait_s, deadline_first = left, True
            try:
                with slot_held(
                    holder,
                    limit=endpoint_limit(conf.name, conf.max_concurrency),
                    wait_s=wait_s,
                    key=conf.slots_key,
                ):
                    response = self.inner.complete(request, on_text)
            except SlotTimeout:
                if deadline_first:
                    raise CallPastDeadline(
                        f"the run's time ran out while it waited for a slot of endpoint {conf.name}"
                    ) from None
                raise EndpointBusy(
                    f"endpoint {conf.name}: all {conf.max_concurrency} slots stayed busy "
                    f"for {wait_s:g}s"
                ) from None
            except ProviderError as exc:
                wait = rate_limit_wait(exc, attempt=attempt)
                if wait is None:
                    raise
                if attempt >= settings.ENDPOINTS_RATE_LIMIT_TRIES:
                    raise type(exc)(
                        f"{exc} (refused for load {attempt} times in a row by endpoint {conf.name})"
                    ) from exc.__cause__
                # Its own call is over (its slot given back): it was in flight too.
                in_flight = slots_in_use(key=conf.slots_key) + 1
                limit = endpoint_rate_limited(conf.name, conf.max_concurrency, in_flight=in_flight)
                run_id = request.run.agent_run_id
                if wait > settings.ENDPOINTS_RETRY_AFTER_MAX_S:
                    if rate_limit_suspensions(run_id) > settings.ENDPOINTS_RATE_LIMIT_TRIES:
                        raise type(exc)(
                            f"{exc} (the run waited out endpoint {conf.name}'s rate limit "
                            f"{settings.ENDPOINTS_RATE_LIMIT_TRIES} times already)"
                        ) from exc.__cause__
                    raise RateLimitWait(
                        f"rate-limited by endpoint {conf.name}: it asked to wait {wait:.0f}s; "
                        "the run resumes then, holding no worker meanwhile",
                        wait_s=wait,
                    ) from exc
                logger.warning(
                    "endpoint %s rate-limited the call (%s): concurrency now %d, "
                    "asking again in %.2fs",
                    conf.name, exc, int(limit), wait,
                    extra={"agent_run_id": run_id, "endpoint": conf.name},
                )  # fmt: skip
                time.sleep(wait)  # holding no slot
                attempt += 1
                continue
            endpoint_call_succeeded(conf.name, conf.max_concurrency)
            return response


def endpoint_provider(conf: EndpointConf) -> LimitedProvider:
    """The provider a run routed to `conf` calls (its key read from the environment now)."""
    return LimitedProvider(conf, _base_provider(conf))


# The providers that call a model endpoint of their own settings when the registry routes nothing:
# the variable naming its URL, and the URL its SDK calls without one.
_SETTINGS_BASE_URL = {
    EndpointProvider.ANTHROPIC.value: ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
    EndpointProvider.OPENAI.value: ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
}


def settings_endpoint(provider: str, *, base_url: str | None = None) -> EndpointConf | None:
    """The endpoint a provider calls by its own settings (its SDK's base URL and key from the
    environment; `base_url` when given: a CLI agent's gateway forwards there), as the rate
    limits see it: named by the provider and the URL it calls, so every run on the same server
    shares one concurrency, across workers and executors. None for a provider without one."""
    known = _SETTINGS_BASE_URL.get(provider)
    if known is None:
        return None
    variable, default_url = known
    if base_url is None:
        base_url = os.environ.get(variable, "")
    return EndpointConf(
        name=f"{provider}@{(base_url or default_url).rstrip('/')}",
        provider=provider,
        model="",
        base_url=base_url,
        api_key_env="",
        tier="",
        max_concurrency=settings.ENDPOINTS_SETTINGS_CONCURRENCY,
        price=None,
        from_settings=True,
    )


def settings_endpoint_provider(provider: Provider) -> Provider:
    """`provider` (made by name, calling its settings' endpoint) with the rate-limit handling of
    a registry endpoint: its calls share the endpoint's concurrency, lowered when it answers 429
    or 529, and wait out its `retry-after` without a slot (or suspended, without a worker). A
    provider that calls no endpoint (scripted, shell, noop) is returned as it is."""
    conf = settings_endpoint(provider.name)
    if conf is None or isinstance(provider, LimitedProvider):
        return provider
    if conf.provider == EndpointProvider.ANTHROPIC:
        from psychonauts.routing.providers.anthropic import AnthropicProvider

        # The process's shared clients (psychonauts.routing.providers.anthropic.shared_client).
        return LimitedProvider(conf, AnthropicProvider(rate_limits_to_caller=True))
    return LimitedProvider(conf, _base_provider(conf))


# --- health checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    name: str
    up: bool
    reason: str
    how: str  # "models" (the models list) or "request" (a one-token request)
    ms: int
    changed: bool = False


def endpoint_check(conf: EndpointConf, *, thorough: bool) -> CheckResult:
    """Ask the endpoint something cheap: its models list (free, no tokens); a one-token request
    when `thorough` (it is down, or runs failed on it), since a server may list its models and
    still fail to answer (coming back needs a real answer)."""
    started = time.monotonic()
    how = "request" if thorough else "models"
    try:
        _probe(conf, how)
        up, reason = True, ""
    except Exception as exc:  # anything the endpoint does wrong is its verdict, not ours
        up, reason = False, _reason(exc)
    return CheckResult(conf.name, up, reason, how, int((time.monotonic() - started) * 1000))


def _probe(conf: EndpointConf, how: str) -> None:
    """Raises what the endpoint did wrong; returns when it answered as it should."""
    problem = endpoint_destination_problem(conf.base_url, conf.api_key_env, resolve=True)
    if problem is not None:
        raise ProbeFailed(f"refused, no request sent: {problem}")
    if conf.api_key_env and not os.environ.get(conf.api_key_env):
        raise ProbeFailed(f"the environment variable {conf.api_key_env} is not set")
    timeout = float(settings.ENDPOINTS_HEALTH_TIMEOUT_S)
    key = conf.api_key()
    hello: list[Any] = [{"role": "user", "content": "Reply with: ok"}]
    if conf.provider == EndpointProvider.ANTHROPIC:
        import anthropic

        anthropic_client = anthropic.Anthropic(
            base_url=conf.base_url or None,
            api_key=key if key is not None else os.environ.get("ANTHROPIC_API_KEY", ""),
            max_retries=0,
            timeout=timeout,
        )
        with anthropic_client:
            if how == "request":
                answer = anthropic_client.messages.create(
                    model=conf.model, max_tokens=1, messages=hello
                )
                if not isinstance(answer.content, list):
                    raise ProbeFailed("the answer has no content")
                return
            served = [m.id for m in anthropic_client.models.list(limit=1000)]
    else:
        import openai

        openai_client = openai.OpenAI(
            base_url=conf.base_url or None,
            api_key=(key if key is not None else os.environ.get("OPENAI_API_KEY", ""))
            or "not-needed",
            max_retries=0,
            timeout=timeout,
        )
        with openai_client:
            if how == "request":
                completion = openai_client.chat.completions.create(
                    model=conf.model, max_tokens=1, messages=hello
                )
                if not isinstance(completion, BaseModel) or not completion.choices:
                    raise ProbeFailed(f"the answer is not a chat completion: {completion!r:.200}")
                return
            served = [m.id for m in openai_client.models.list()]
    if served and conf.model not in served:
        listed = ", ".join(sorted(served)[:10])
        raise ProbeFailed(f"model {conf.model!r} is not served (it serves {listed})")


class ProbeFailed(Exception):
    """A health check's own finding (the endpoint answered, but not as it should)."""


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if type(exc).__name__ in {"APITimeoutError", "ReadTimeout", "ConnectTimeout"}:
        text = "timed out"
    elif type(exc).__name__ == "APIConnectionError":
        text = f"cannot connect ({exc.__cause__ or exc})"
    return redact(text if isinstance(exc, ProbeFailed) else f"{type(exc).__name__}: {text}")


def endpoints_health_check(*, names: list[str] | None = None) -> list[CheckResult]:
    """Check every enabled endpoint of the registry (or those named, enabled or not: an
    operator checks an endpoint before switching it on) at once and record each verdict: down
    (with the reason; routing skips it) or up (routing takes it again)."""
    registry_invalidate()
    confs = tuple(
        c for c in registry_snapshot() if (c.name in names if names is not None else c.enabled)
    )
    if not confs:
        return []
    states = {s.conf.name: s for s in endpoints_state(confs)}

    def check(conf: EndpointConf) -> CheckResult:
        state = states[conf.name]
        return endpoint_check(conf, thorough=state.down or state.failures > 0)

    with ThreadPoolExecutor(max_workers=min(16, len(confs))) as pool:
        results = list(pool.map(check, confs))
    now = timezone.now()
    recorded = []
    for result in results:
        changed = endpoint_health_record(
            name=result.name, up=result.up, reason=result.reason, now=now,
            was_down=states[result.name].down,
        )  # fmt: skip
        recorded.append(dataclasses.replace(result, changed=changed))
    return recorded
