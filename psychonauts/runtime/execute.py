"""Executing an agent run: read it, route it, claim it, run its loop, turn what stops it into an
outcome.

`agent_run_execute` is the one entry point (Celery-free). It is idempotent: a terminal run
returns its stored outcome; a non-terminal run resumes from its last checkpointed turn, and a
tool call recorded as completed is never executed again.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from bursts.executor import Outcome
from bursts.models import AGENT_TERMINAL, AgentRun, AgentStatus
from core.redaction import redact
from core.workers import worker_name
from psychonauts.containment.sandbox import sandbox_require
from psychonauts.errors import (
    INFRASTRUCTURE,
    AgentRunNotFound,
    ContextOverflow,
    InfrastructureError,
    ProviderError,
    PsychonautError,
    RateLimitWait,
    RoleNotFound,
    SuspendRun,
)
from psychonauts.events import agent_event
from psychonauts.executors.shell import MODEL as SHELL_MODEL
from psychonauts.models import Role
from psychonauts.roles import roles_sync_defaults
from psychonauts.routing import registry
from psychonauts.routing.endpoints import (
    EndpointBusy,
    EndpointConf,
    EndpointState,
    endpoint_failure,
    endpoint_provider,
    endpoint_success,
    endpoints_down,
    endpoints_state,
    registry_enabled,
    settings_endpoint_provider,
)
from psychonauts.routing.providers import provider_get
from psychonauts.routing.providers.base import Provider
from psychonauts.routing.ratelimits import rate_limit_resume_schedule
from psychonauts.runtime.checkpoint import run_claim, run_read
from psychonauts.runtime.runner import Observer, Runner
from psychonauts.runtime.runs import agent_run_fail, agent_run_suspend, run_outcome
from quanta.complexity import complexity_classify
from quanta.models import Complexity, QuantumKind
from repos.context import working_on_id

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    provider: Provider
    model: str
    note: str = ""  # why the run does not get its tier's model (it is down), for its events
    endpoint: str = ""  # the registry endpoint's name, when the registry routed the run
    why: str = ""  # how the route was chosen, for the run's `started` event

    @property
    def health_key(self) -> tuple[str, str]:
        """The (provider, model) pair its failures count under (`psychonauts.routing.endpoints`)."""
        return (self.provider.name, self.endpoint or self.model)


# Where a tier's runs go when its model is down: the next tier down, then up.
FALLBACK: dict[str, tuple[str, ...]] = {
    Complexity.COMPLEX: (Complexity.COMPLEX, Complexity.STANDARD, Complexity.TRIVIAL),
    Complexity.STANDARD: (Complexity.STANDARD, Complexity.TRIVIAL, Complexity.COMPLEX),
    Complexity.TRIVIAL: (Complexity.TRIVIAL, Complexity.STANDARD, Complexity.COMPLEX),
}


def _route(run: AgentRun, role: Role) -> Route:
    """The provider and model for a run.

    - A trivial quantum (not an epic) whose steps are mechanical (`quanta.complexity`) runs on
      the `shell` provider, without a model, when PSYCHONAUTS_TRIVIAL_NO_LLM is on: whatever
      provider the run, the setting or the role names (the scripted one included), since the
      point is that no model is asked at all.
    - Otherwise the provider is the run's own, else the setting's, else the role's; one without
      a model (scripted, noop) is its own model.
    - When the registry of endpoints has enabled ones for the run, it decides
      (`registry_route`): an endpoint of the tier, with its own provider and model.
    - Otherwise the model is the run's or the role's when named; else the quantum's tier's
      (PSYCHONAUTS_MODELS), skipping a model that is down (`psychonauts.routing.endpoints`) for the next
      tier's; when every one is down, the tier's own, and the note says so.
    """
    quantum = run.quantum
    complexity = quantum.complexity
    if (
        complexity == Complexity.TRIVIAL
        and quantum.kind != QuantumKind.EPIC  # a goal's epic is planned, never run as steps
        and getattr(settings, "PSYCHONAUTS_TRIVIAL_NO_LLM", True)
        and complexity_classify(quantum.title, quantum.body).mechanical
    ):
        return Route(
            provider_get("shell"), SHELL_MODEL, why="mechanical steps of a trivial quantum"
        )
    provider = provider_get(run.provider or settings.PSYCHONAUTS_PROVIDER or role.provider)
    if not provider.uses_llm:
        return Route(provider, provider.name, why=f"provider {provider.name} (no model)")
    registry = registry_enabled()
    miss = ""
    if registry:
        routed = registry_route(
            role, registry, model=run.model, complexity=complexity, provider=run.provider
        )
        if isinstance(routed, Route):
            return routed
        miss = routed
    # Its settings' endpoint gets the rate-limit handling a registry endpoint has.
    route = _settings_route(
        settings_endpoint_provider(provider), run.model or role.model, complexity
    )
    if run.model or role.model:
        named_by = "the run" if run.model else f"role {role.name}"
        route = dataclasses.replace(route, why=f"model named by {named_by}")
    if miss:
        route = dataclasses.replace(route, note="; ".join(n for n in (miss, route.note) if n))
    return route


def _settings_route(provider: Provider, named: str, complexity: str) -> Route:
    """The run's model as without a registry: the one named, else the tier's (skipping one
    that is down for the next tier's)."""
    if named:
        return Route(provider, named)
    models: dict[str, str] = settings.PSYCHONAUTS_MODELS
    candidates = list(
        dict.fromkeys(models[t] for t in FALLBACK.get(complexity, (complexity,)) if models.get(t))
    )
    if not candidates:
        return Route(provider, "")
    down = endpoints_down([(provider.name, m) for m in candidates])
    for model in candidates:
        if (provider.name, model) not in down:
            note = "" if model == candidates[0] else f"{candidates[0]} is down; routed to {model}"
            return Route(provider, model, note, why=f"the {complexity} tier's model (settings)")
    return Route(
        provider,
        candidates[0],
        f"every configured model is down ({', '.join(candidates)}); using {candidates[0]}",
    )


# Where the registry sends a tier's runs: its own endpoints, then only the tiers above (a
# complex quantum never goes to a small model because it is the only one registered).
REGISTRY_TIERS: dict[str, tuple[str, ...]] = {
    Complexity.TRIVIAL: (Complexity.TRIVIAL, Complexity.STANDARD, Complexity.COMPLEX),
    Complexity.STANDARD: (Complexity.STANDARD, Complexity.COMPLEX),
    Complexity.COMPLEX: (Complexity.COMPLEX,),
}


def registry_route(
    role: Role,
    registry: tuple[EndpointConf, ...],
    *,
    model: str,
    complexity: str,
    provider: str = "",
) -> Route | str:
    """A registry endpoint for an LLM call of `role` (a run's, whose `model`, `provider` and
    quantum's `complexity` are given; "" when it names none), or why the registry does not
    route it ("" when it has nothing for it: then the call is routed as without a registry).

    - What the run names wins: a `provider` keeps it to that provider's endpoints, a `model` to
      the endpoints serving it; a role naming a model takes the endpoints serving that model,
      whatever their tier. Named, and no endpoint serves it: not the registry's.
    - Otherwise the run's tier's endpoints, then the tiers above (`REGISTRY_TIERS`) when every
      one of its own is down; never a tier below.
    - Among the endpoints of a tier that are not down: the fewest failures in a row first (a
      retry whose endpoint failed goes to another one), then the least loaded (calls in flight
      over its limit). When all are full the run still goes to the least loaded, whose next
      free slot it waits for.
    - Only to an endpoint that is up: when every candidate is down, the registry does not route
      the run, and says why.
    """
    if provider:
        registry = tuple(c for c in registry if c.provider == provider)
    named = model or role.model
    if named:
        candidates = tuple(c for c in registry if c.model == named)
        if not candidates:
            return ""
        tiers: list[tuple[EndpointConf, ...]] = [candidates]
    else:
        order = REGISTRY_TIERS.get(complexity, (complexity,))
        tiers = [tuple(c for c in registry if c.tier == t) for t in order]
        tiers = [t for t in tiers if t]
        if not tiers:
            return ""
    states = {s.conf.name: s for s in endpoints_state(tuple(c for t in tiers for c in t))}

    def rank(state: EndpointState) -> tuple[int, float, str]:
        c = state.conf
        return (state.failures, state.in_flight / c.max_concurrency, c.name)

    first = tiers[0][0]
    for number, tier in enumerate(tiers):
        healthy = sorted((states[c.name] for c in tier if not states[c.name].down), key=rank)
        if not healthy:
            continue
        chosen = healthy[0].conf
        notes = []
        if number:
            notes.append(
                f"every endpoint of tier {first.tier} is down; routed to tier {chosen.tier}"
            )
        elif any(states[c.name].down for c in tier):
            down = ", ".join(c.name for c in tier if states[c.name].down)
            notes.append(f"{down} down; routed to {chosen.name}")
        if healthy[0].failures:
            notes.append(f"{chosen.name} has {healthy[0].failures} failures in a row")
        why = f"endpoint {chosen.name} of tier {chosen.tier}"
        if named:
            why = f"endpoint {chosen.name}, serving the model {named} named"
        elif provider:
            why += f", provider {provider} named"
        return Route(endpoint_provider(chosen), chosen.model, "; ".join(notes), chosen.name, why)
    names = ", ".join(c.name for t in tiers for c in t)
    return f"every registry endpoint for it is down ({names}); routed by the settings"


def agent_run_execute(*, agent_run_id: int, observer: Observer | None = None) -> Outcome:
    """Execute (or resume) one agent run to an outcome. Safe to call again on the same run.
    Its git, worktree and checks are its quantum's repository's."""
    repository_id = (
        AgentRun.objects.filter(pk=agent_run_id).values_list("quantum__repository_id", flat=True)
    ).first()
    with working_on_id(repository_id):
        return _agent_run_execute(agent_run_id=agent_run_id, observer=observer)


def _agent_run_execute(*, agent_run_id: int, observer: Observer | None) -> Outcome:
    found = run_read(agent_run_id)
    if found is None:
        raise AgentRunNotFound(f"agent run {agent_run_id} does not exist")
    run, role = found
    if run.status in AGENT_TERMINAL:
        return run_outcome(run)
    if role is None:
        role = _role(run.role)
    route: Route | None = None
    refusal: PsychonautError = RoleNotFound(f"unknown role {run.role!r}")
    if role is not None:
        try:
            route = _route(run, role)
            if not role.allowed_tools or "shell" in role.allowed_tools:
                sandbox_require()
        except PsychonautError as exc:
            route, refusal = None, exc
    now, worker = timezone.now(), worker_name()
    claimed, session_id = run_claim(
        agent_run_id=run.pk,
        worker=worker,
        now=now,
        route=(route.provider.name, route.model) if route else None,
        title=f"{run.agent_id} attempt {run.attempt}",
    )
    if not claimed:
        run.refresh_from_db()
        return run_outcome(run)
    resumed = run.started_at is not None
    run.status, run.worker, run.heartbeat_at = AgentStatus.RUNNING, worker, now
    run.started_at = run.started_at or now
    if route is not None:
        run.provider, run.model = route.provider.name, route.model
    runner: Runner | None = None
    try:
        if role is None or route is None or session_id is None:
            raise refusal
        # The role's executor chooses the loop: ours, or an agent CLI (psychonauts.executors).
        from psychonauts.executors.dispatch import runner_class

        runner = runner_class(role)(
            run,
            role,
            (route.provider, route.model),
            observer,
            session_id=session_id,
            resumed=resumed,
            execute=agent_run_execute,
        )
        runner.emit(
            "started",
            role=run.role,
            provider=runner.provider.name,
            model=runner.model,
            **({"endpoint": route.endpoint} if route.endpoint else {}),
            **({"route": route.why} if route.why else {}),
        )
        if route.note:
            runner.emit(
                "routed", provider=runner.provider.name, model=runner.model, note=route.note
            )
        outcome = runner.loop()
        endpoint_success(*route.health_key)
        return outcome
    except SuspendRun as exc:
        if runner is not None and (stale := runner.set_aside()) is not None:
            return stale
        suspended = agent_run_suspend(agent_run_id=run.pk)
        if suspended and isinstance(exc, RateLimitWait):
            rate_limit_resume_schedule(agent_run_id=run.pk, wait_s=exc.wait_s)
        run.refresh_from_db()
        registry.registry_sync(run)
        reason = redact(str(exc))
        if runner is not None:
            runner.emit("waiting", reason=reason)
            runner.flush_events()
        return Outcome("waiting", error=reason)
    except ProviderError as exc:
        # The provider's own retries are spent: its endpoint failed (a busy one did not, nor
        # one handed a request over the model's context).
        if route is not None and not isinstance(exc, (EndpointBusy, ContextOverflow)):
            endpoint_failure(*route.health_key)
        if isinstance(exc, (InfrastructureError, EndpointBusy)):
            return _fail(run, runner, f"{INFRASTRUCTURE}{exc}")
        return _fail(run, runner, str(exc))
    except PsychonautError as exc:
        return _fail(run, runner, str(exc))
    except Exception as exc:
        logger.exception("agent run %s crashed", run.pk, extra={"agent_run_id": run.pk})
        return _fail(run, runner, f"internal error: {type(exc).__name__}: {exc}")


def _role(name: str) -> Role | None:
    """A role the run's read did not find: on a fresh database, load the shipped roles first."""
    roles_sync_defaults()
    return Role.objects.filter(name=name).first()


def _fail(run: AgentRun, runner: Runner | None, reason: str) -> Outcome:
    reason = redact(reason)  # an exception's message may quote anything
    if runner is None:
        updated = agent_run_fail(agent_run_id=run.pk, error=reason)
        registry.registry_remove(run.pk)
        if updated != 1:
            run.refresh_from_db()
            return run_outcome(run)
        agent_event(run.agent_id, "error", {"agent_run_id": run.pk, "error": reason})
        return Outcome("error", error=reason)
    return runner.finish(AgentStatus.ERROR, error=reason)
