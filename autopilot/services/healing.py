"""Healing: stuck agents cancelled and requeued, failing provider endpoints marked down, and
each repository's integration branch's checks (the one writer of BaseCheck), with a healing
quantum filed in that repository after repeated failures of its own checks.

The hub's tick calls `healing_act` when its snapshot shows something to heal; each action is
guarded, so a second tick (or the burst manager finishing the same agent) finds nothing to do.
A repository's checks run in a Celery task (`autopilot.base_check` with the repository's id,
sent by the tick when that repository's are due) in a scratch worktree of that repository
detached at its branch's tip, through the command guard and the sandbox. A repository whose
branch fails is healed alone: the others' checks, streaks and healing quanta are their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autopilot.events import healing_event
from autopilot.labels import filed_labels
from autopilot.models import BaseCheck
from autopilot.predicates import bases_to_heal, duration
from autopilot.snapshot import FailingEndpoint, RepositoryState, Snapshot, StuckAgent
from bursts.canvas import StageDispatch, stages_send
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.agent_runs import agent_run_next_attempt, agent_run_time_out
from bursts.services.quantum_runs import quantum_run_redispatch
from bursts.services.stages import stage_spec
from core.redis import get_redis
from psychonauts.containment.identities import BASE_CHECK
from psychonauts.containment.sandbox import workspace_own
from psychonauts.containment.verify import verify_commands_run
from psychonauts.routing.endpoints import endpoint_mark_down
from psychonauts.workspaces.repository import file_lock_try, repo_key
from psychonauts.workspaces.worktrees import scratch_worktree
from quanta.models import Quantum
from quanta.pipeline_models import StageMode
from quanta.services import quantum_create
from repos.context import current, working_on_id
from repos.services import default_repository_id
from tether.services.changes import sha_of, target_branch

logger = logging.getLogger(__name__)

# The most of a failing check's summary a BaseCheck keeps, and a healing quantum's body quotes.
SUMMARY_LIMIT = 20_000
BODY_LIMIT = 8_000
# The base checks run as their own sandbox identity (they belong to no quantum).
BASE_CHECK_QUANTUM = BASE_CHECK


# --- stuck agents -------------------------------------------------------------------------------


def _positions(run: QuantumRun, position: int) -> tuple[int, ...]:
    """What to send again for a slot: the slot (fan-out), or the chain from it (sequential)."""
    spec = stage_spec(run)
    if spec["mode"] == StageMode.SEQUENTIAL:
        return tuple(range(position, len(spec["agents"])))
    return (position,)


@transaction.atomic
def agent_unstick(*, agent_run_id: int, quiet_s: float) -> bool:
    """Cancel a stuck agent run and, when it is a slot of a running stage, give the slot its
    next attempt and send the stage again; False when it was no longer running.

    The run is locked before the agent changes (the run step's lock order); the hung execution
    finds its attempt cancelled at its next turn and stops, and the stage tasks' leases make
    its late return harmless. A sub-agent or a lone agent is only cancelled: its parent (or its
    caller) sees the cancellation."""
    agent = (
        AgentRun.objects.filter(pk=agent_run_id)
        .only("agent_id", "attempt", "status", "quantum_run_id", "parent_id", "stage_index",
              "position", "quantum_id", "role", "provider", "model")
        .first()
    )  # fmt: skip
    if agent is None or agent.status != AgentStatus.RUNNING:
        return False
    run: QuantumRun | None = None
    if agent.quantum_run_id is not None and agent.parent_id is None:
        run = (
            QuantumRun.objects.select_for_update()
            .filter(pk=agent.quantum_run_id)
            .only("status", "current_stage", "pipeline_snapshot", "dispatched_at", "wave_id")
            .first()
        )
    now = timezone.now()
    why = (
        f"stuck: no progress for {duration(quiet_s)} (the limit is "
        f"{duration(settings.AUTOPILOT_STUCK_S)}); cancelled by the autopilot's healing"
    )
    if not agent_run_time_out(agent_run_id=agent.pk, error=why, now=now):
        return False
    requeued = (
        run is not None
        and run.status == RunStatus.RUNNING
        and run.current_stage == agent.stage_index
    )
    if run is not None and requeued:
        agent_run_next_attempt(agent=agent)
        if quantum_run_redispatch(run_id=run.pk, dispatched_at=run.dispatched_at, now=now):
            stages_send(
                [
                    StageDispatch(
                        run.pk,
                        run.current_stage,
                        stage_spec(run)["mode"],
                        _positions(run, agent.position),
                    )
                ]
            )
    logger.warning(
        "autopilot healing: agent run %s (%s) stuck for %.0f s: cancelled%s",
        agent.pk,
        agent.agent_id,
        quiet_s,
        " and requeued" if requeued else "",
        extra={"agent_run_id": agent.pk, "quantum_run_id": agent.quantum_run_id},
    )
    healing_event(
        "agent_unstuck",
        {
            "agent_run_id": agent.pk,
            "agent_id": agent.agent_id,
            "quantum_run_id": agent.quantum_run_id,
            "quiet_s": round(quiet_s, 1),
            "requeued": requeued,
            "reason": why,
        },
    )
    return True


def stuck_agents_heal(stuck: tuple[StuckAgent, ...]) -> list[str]:
    done: list[str] = []
    for agent in stuck:
        try:  # agent_unstick is atomic: a failure rolls back that agent alone
            if agent_unstick(agent_run_id=agent.agent_run_id, quiet_s=agent.quiet_s):
                done.append(f"agent {agent.agent_id} (run {agent.agent_run_id}) cancelled")
        except Exception:
            logger.exception("autopilot healing: agent run %s", agent.agent_run_id)
    return done


# --- endpoints ----------------------------------------------------------------------------------


def endpoints_heal(endpoints: tuple[FailingEndpoint, ...]) -> list[str]:
    """Mark each failing endpoint down for AUTOPILOT_ENDPOINT_DOWN_S (routing skips it)."""
    ttl = float(settings.AUTOPILOT_ENDPOINT_DOWN_S)
    done: list[str] = []
    for e in endpoints:
        reason = (
            f"{e.failures} failures in a row; marked down for {duration(ttl)} by the "
            "autopilot's healing"
        )
        endpoint_mark_down(provider=e.provider, model=e.model, reason=reason, ttl_s=ttl)
        healing_event("endpoint_marked_down",
            {"provider": e.provider, "model": e.model, "failures": e.failures, "ttl_s": ttl,
             "reason": reason},
        )  # fmt: skip
        logger.warning("autopilot healing: endpoint %s/%s down: %s", e.provider, e.model, reason)
        done.append(f"endpoint {e.provider}/{e.model} marked down")
    return done


# --- the integration branch's checks ------------------------------------------------------------


def base_check_commands() -> list[str]:
    """The checks of the repository at hand: its verify commands (the default repository's hold
    TETHER_VERIFY_COMMANDS) and the scanners' test command."""
    commands = list(current().verify_commands)
    test = str(getattr(settings, "AUTOPILOT_SCAN_TEST_COMMAND", "") or "").strip()
    if test and test not in commands:
        commands.append(test)
    return commands


def bases_due(s: Snapshot) -> tuple[RepositoryState, ...]:
    """The repositories with checks configured whose last check is older than
    AUTOPILOT_BASE_CHECK_S (or that have none yet)."""
    every = timedelta(seconds=s.limits.base_check_every_s)
    return tuple(
        r
        for r in s.repositories
        if r.has_checks and (r.base_checked_at is None or s.at - r.base_checked_at >= every)
    )


def base_check_due(s: Snapshot) -> bool:
    """Some repository's checks are due."""
    return bool(bases_due(s))


def base_check_claim(s: Snapshot, *, repository_id: int) -> bool:
    """Claim this period's check of a repository (one send per period, whatever the ticks; a
    check that never ran is sent again once the claim lapses)."""
    ttl_ms = max(1000, int(s.limits.base_check_every_s * 1000))
    key = f"autopilot:base_check:r{repository_id}"
    return bool(get_redis().set(key, s.at.isoformat(), nx=True, px=ttl_ms))


def _scratch_at(sha: str) -> Path:
    """The base check's worktree, detached at `sha` and clean (what the last check left is gone)."""
    return scratch_worktree(Path(settings.ANNIHILATION_HOME) / "checks" / f"base-{repo_key()}", sha)


def base_check_run(*, repository_id: int | None = None) -> BaseCheck | None:
    """Run a repository's checks (None: the default repository's) on its integration branch's
    tip and record the result. None when it has no check configured, its branch has no
    commit, or another check of it is running."""
    if repository_id is None:
        repository_id = default_repository_id()
    with working_on_id(repository_id) as target:
        if target.repository_id is None:  # removed since the check was sent
            return None
        return _base_check_run(target.repository_id)


def _base_check_run(repository_id: int) -> BaseCheck | None:
    commands = base_check_commands()
    if not commands:
        return None
    # One base check at a time per repository (they share a scratch worktree).
    with file_lock_try(f"base-check-{repo_key()}") as held:
        if not held:
            return None
        target = target_branch()
        sha = sha_of(target)
        if not sha:
            logger.warning("autopilot base check: %s names no commit", target)
            return None
        where = _scratch_at(sha)
        workspace_own(where, quantum_id=BASE_CHECK_QUANTUM)
        report = verify_commands_run(commands, workspace=where, quantum_id=BASE_CHECK_QUANTUM)
    summary = report.summary()
    if len(summary) > SUMMARY_LIMIT:
        summary = summary[:SUMMARY_LIMIT] + "\n[... cut ...]"
    with transaction.atomic():
        check = BaseCheck.objects.create(
            repository_id=repository_id, sha=sha, ok=report.passed, summary=summary
        )
        healing_event("base_checked",
            {"id": check.pk, "repository_id": repository_id, "sha": sha, "branch": target,
             "ok": check.ok, "failed": [c.command for c in report.failed]},
        )  # fmt: skip
    return check


def base_healing_file(s: Snapshot) -> list[Quantum]:
    """File a healing quantum (priority 0) in each repository whose branch failed its checks
    often enough in a row with none open, linked from the latest of its checks. Called under
    the hub's lock (the tick), so two ticks never file two."""
    filed: list[Quantum] = []
    for state in bases_to_heal(s):
        repository_id = state.repository_id or default_repository_id()
        try:  # in a savepoint of its own: one repository's failure leaves the others' filing
            with transaction.atomic(), working_on_id(repository_id):
                quantum = _healing_file(repository_id, s.limits.base_failures)
        except Exception:
            logger.exception("autopilot healing: the healing quantum of repository %s", state.name)
            continue
        if quantum is not None:
            filed.append(quantum)
    return filed


def _healing_file(repository_id: int, failures: int) -> Quantum | None:
    """The healing quantum of the repository at hand, None when its checks no longer fail
    `failures` times in a row or one is open already."""
    checks_of = BaseCheck.objects.filter(repository_id=repository_id)
    checks = list(checks_of.order_by("-created_at", "-id")[:failures])
    if len(checks) < failures or any(c.ok for c in checks):
        return None
    if checks_of.filter(quantum__isnull=False).exclude(quantum__status="closed").exists():
        return None
    latest = checks[0]
    target = target_branch()
    summary = latest.summary
    if len(summary) > BODY_LIMIT:
        summary = summary[:BODY_LIMIT] + "\n[... cut ...]"
    name = current().name
    body = (
        f"The integration branch `{target}` of repository {name} failed its checks "
        f"{len(checks)} times in a row (the latest at {latest.sha[:12]}, "
        f"{latest.created_at:%Y-%m-%d %H:%M} UTC). Make them pass again without weakening "
        f"them.\n\n## The latest result\n{summary}"
    )
    quantum = quantum_create(
        title=f"Heal {target}: its checks failed {len(checks)} times in a row"[:500],
        body=body,
        kind="bug",
        priority=0,
        labels=filed_labels("healing", "healing"),
        acceptance=f"Every check passes on {target}: {', '.join(base_check_commands())}"[:5000],
        repository_id=repository_id,
    )
    BaseCheck.objects.filter(pk=latest.pk).update(quantum=quantum)
    healing_event(
        "healing_quantum_filed",
        {
            "quantum_id": quantum.pk,
            "repository_id": repository_id,
            "sha": latest.sha,
            "failures": len(checks),
            "branch": target,
        },
    )
    return quantum


# --- what the tick calls ------------------------------------------------------------------------


def _base_heal(s: Snapshot) -> list[str]:
    return [
        f"healing quantum #{quantum.pk} filed for the integration branch"
        for quantum in base_healing_file(s)
    ]


def healing_act(s: Snapshot) -> list[str]:
    """Every healing action the snapshot calls for; what was done, in words. Each kind runs in
    a savepoint of its own: one that fails is logged and the others (and the tick) go on."""
    done: list[str] = []
    actions: list[tuple[str, Callable[[], list[str]]]] = [
        ("stuck agents", lambda: stuck_agents_heal(s.stuck)),
        ("endpoints", lambda: endpoints_heal(s.endpoints)),
        ("the integration branch", lambda: _base_heal(s)),
    ]
    for what, action in actions:
        try:
            with transaction.atomic():
                done += action()
        except Exception:
            logger.exception("autopilot healing: %s failed", what)
    return done


__all__ = [
    "agent_unstick",
    "base_check_claim",
    "base_check_commands",
    "base_check_due",
    "base_check_run",
    "base_healing_file",
    "bases_due",
    "endpoints_heal",
    "healing_act",
    "stuck_agents_heal",
]
