"""The agent run rows the runtime writes outside the turn loop's checkpoints: creating runs (from
the CLI, for sub-agents), marking one waiting or failed before it got going, recording the answer
to a pending tool call, and the outcome a finished row holds."""

from __future__ import annotations

from django.db import IntegrityError
from django.utils import timezone

from bursts.executor import Outcome, OutcomeStatus
from bursts.models import AgentRun, AgentStatus
from bursts.services import agent_runs
from core.redaction import redact
from psychonauts.errors import PsychonautError
from psychonauts.runtime.checkpoint import tool_call_answer
from psychonauts.runtime.tools import SpawnSpec


def agent_run_create(
    *,
    quantum_id: int,
    role: str,
    provider: str = "",
    model: str = "",
    context: str = "",
    agent_id: str = "",
) -> AgentRun:
    """A standalone agent run (CLI): agent id `<quantum>_cli_<role>`, next attempt number."""
    agent_id = agent_id or f"{quantum_id}_cli_{role}"
    for _ in range(5):
        last = (
            AgentRun.objects.filter(agent_id=agent_id).order_by("-attempt").values_list(
                "attempt", flat=True
            ).first()
        )  # fmt: skip
        try:
            return agent_runs.agent_run_insert(
                agent_id=agent_id,
                attempt=(last or 0) + 1,
                quantum_id=quantum_id,
                role=role,
                provider=provider,
                model=model,
                context=context,
            )
        except IntegrityError:
            continue  # another process took that attempt number: take the next one
    raise PsychonautError(f"could not allocate an attempt number for {agent_id}")


def agent_run_children_create(
    *, parent: AgentRun, turn_index: int, specs: list[SpawnSpec]
) -> list[AgentRun]:
    """The sub-agent runs of a parent's spawn call, one per spec; those a resumed parent made
    before are found again (their agent id is derived from the parent's and the call's position)."""
    return [
        agent_runs.agent_run_child_get_or_create(
            parent=parent,
            agent_id=f"{parent.agent_id}.t{turn_index}c{i}_{spec['role']}"[:200],
            position=i,
            role=spec["role"],
            # Stored: redacted (the child reads its prompt from this row).
            context=redact(f"## Task from {parent.agent_id}\n{spec['task']}"),
        )
        for i, spec in enumerate(specs)
    ]


def agent_run_stop_orphan(*, run: AgentRun) -> bool:
    """A sub-agent whose parent, or any agent above it, has ended stops too (cancelled, with
    whose end stopped it): nothing of a spawn tree outlives its root. True when it stopped."""
    if run.parent_id is None:
        return False
    ended = agent_runs.agent_run_ancestor_ended(agent_run_id=run.pk)
    if ended is None:
        return False
    agent_id, status = ended
    return agent_runs.agent_run_stop(
        agent_run_id=run.pk,
        error=f"stopped: its parent {agent_id} ended {status}",
        now=timezone.now(),
    )


def agent_run_suspend(*, agent_run_id: int) -> int:
    """A running run waits (on a tool call answered from outside); returns the rows updated."""
    return int(agent_runs.agent_run_wait(agent_run_id=agent_run_id, now=timezone.now()))


def agent_run_fail(*, agent_run_id: int, error: str) -> int:
    """A running run ends in error; returns the rows updated (0: someone else ended it first)."""
    return int(
        agent_runs.agent_run_fail(agent_run_id=agent_run_id, error=error, now=timezone.now())
    )


def tool_call_complete(*, agent_run_id: int, tool_use_id: str, output: str, is_error: bool) -> None:
    """Record the result of a pending tool call (ask_tether's answer) before resuming the run;
    stored redacted, as every tool result is."""
    if not tool_call_answer(
        agent_run_id=agent_run_id,
        tool_use_id=tool_use_id,
        output=redact(output),
        is_error=is_error,
    ):
        raise PsychonautError(f"no pending tool call {tool_use_id} on agent run {agent_run_id}")


def run_outcome(run: AgentRun) -> Outcome:
    """The outcome the run's row holds (a run another execution or the burst manager ended)."""
    status: OutcomeStatus = (
        "waiting" if run.status == AgentStatus.WAITING else run.status  # type: ignore[assignment]
    )
    return Outcome(status, run.result, run.error)
