"""Celery tasks: thin adapters over the services (ids in, plain dicts out)."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_init

import core.celery  # noqa: F401  (its shared_tasks are bound to the project's application)
from bursts.executor import OutcomeDict
from psychonauts.environments.services import (
    environment_build_queued,
    environment_waiters_sweep,
)
from psychonauts.errors import AgentRunNotFound
from psychonauts.focus import focus_branches_fetch
from psychonauts.routing.endpoints import endpoints_health_check
from psychonauts.routing.ratelimits import rate_limit_resume_due
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.sweep import workspaces_sweep


@worker_init.connect
def _model_sdk_import(**_: object) -> None:
    """The model SDK is imported when a worker starts (before a prefork pool forks), not by its
    first task: it takes about a second. Not at this module's import: every command line loads
    it (the URL checks import the views that send these tasks), and none of them calls a model."""
    import psychonauts.routing.providers.anthropic  # noqa: F401


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_agent_run(agent_run_id: int) -> OutcomeDict:
    """Execute or resume one agent run. Idempotent: redelivery resumes from the checkpoint.

    The outcome is the AgentRun row (and its events); nobody waits on a Celery result.
    """
    try:
        return agent_run_execute(agent_run_id=agent_run_id).as_dict()
    except AgentRunNotFound as exc:
        return {"status": "error", "result": "", "error": str(exc)}


@shared_task(name="psychonauts.workspaces_sweep", ignore_result=True)
def sweep_workspaces() -> int:
    """Beat: remove the worktrees of closed quanta (see `workspaces_sweep`)."""
    return len(workspaces_sweep())


@shared_task(name="psychonauts.focus_fetch", ignore_result=True)
def focus_fetch(quantum_id: int) -> None:
    """Fetch a quantum's branch and its base for the Focus page's diff (remote mode)."""
    focus_branches_fetch(quantum_id=quantum_id)


@shared_task(name="psychonauts.endpoints_health", ignore_result=True)
def endpoints_health() -> int:
    """Beat: check every enabled endpoint of the registry, marking it down or up; returns how
    many are down."""
    return sum(not r.up for r in endpoints_health_check())


@shared_task(name="psychonauts.rate_limited_resume", ignore_result=True)
def rate_limited_resume(agent_run_id: int | None = None) -> int:
    """Wake a run suspended for a rate limit once its wait is over (sent counting the wait
    down); from the beat, with no run, every run whose wait is over (a lost task's). Returns how
    many were woken."""
    return len(rate_limit_resume_due(agent_run_id=agent_run_id))


@shared_task(
    name="psychonauts.tasks.build_environment",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def build_environment(build_id: int) -> str:
    """Build a repository's environment for the agents waiting on it, then wake them.
    Idempotent: a built (or failed) key only wakes its waiters again."""
    return environment_build_queued(build_id)


@shared_task(name="psychonauts.environment_waiters_sweep", ignore_result=True)
def sweep_environment_waiters() -> int:
    """Agents left waiting on an environment (a lost build task, a lost wakeup): built or
    failed, they are woken; still to build with nobody building, the build is sent again."""
    return environment_waiters_sweep()
