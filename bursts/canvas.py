"""Sending work to Celery: a sequential stage is a chain, a fan-out stage is a chord, and an agent
outside any stage (standalone, or a sub-agent, resumed) is one task.

    sequential: stage_agent(run, k, 0) | stage_agent(run, k, 1) | ... (the last link evaluates)
    fan_out:    chord([stage_agent(run, k, p) for p], stage_done(run, k))
    standalone: agent_execute(agent_run_id)

Every task takes named arguments (`StageAgentArgs`); a chain's later link also receives the
previous link's SlotResult, which Celery passes first. A dispatch that knows the AgentRun ids it
just created passes them along: the task then starts its agent in one statement instead of
looking the slot up (the fast path of `slot_run`). Sequential links store no result (the chain
hands each return value to the next link in the message); chord headers must, for the join.
The tasks are imported where the signatures are built: the tasks module imports the services,
which import this one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from celery import chain, chord, group
from celery.canvas import Signature
from django.db import transaction

from core.celery import app
from quanta.pipeline_models import StageMode

logger = logging.getLogger(__name__)


class StageAgentArgs(TypedDict):
    """The named arguments of `bursts.tasks.stage_agent`: one agent of a stage."""

    quantum_run_id: int
    stage_index: int
    position: int
    # The link that evaluates the stage once its agent ends (a chain's last link).
    final: bool
    # The AgentRun the dispatcher created for this slot, or None (the task looks it up).
    agent_run_id: int | None


@dataclass(frozen=True)
class StageDispatch:
    quantum_run_id: int
    stage_index: int
    mode: str
    positions: tuple[int, ...]
    # The first attempt's AgentRun id per position, when the dispatcher just created them, and
    # the Celery task id recorded on each (so that cancelling the wave can revoke them).
    agent_run_ids: tuple[int, ...] = ()
    task_ids: tuple[str, ...] = ()


def stage_canvas(d: StageDispatch) -> Signature:
    from bursts.tasks import stage_agent, stage_done

    ids: list[int | None] = list(d.agent_run_ids) or [None] * len(d.positions)
    # No recorded id: Celery makes one up.
    opts: list[dict[str, Any]] = [{"task_id": t} for t in d.task_ids] or [{}] * len(d.positions)
    last = len(d.positions) - 1
    args = [
        StageAgentArgs(
            quantum_run_id=d.quantum_run_id,
            stage_index=d.stage_index,
            position=p,
            final=d.mode != StageMode.FAN_OUT and n == last,
            agent_run_id=i,
        )
        for n, (p, i) in enumerate(zip(d.positions, ids, strict=True))
    ]
    if d.mode == StageMode.FAN_OUT:
        header = [
            stage_agent.signature(kwargs=dict[str, Any](a), immutable=True, options=o)
            for a, o in zip(args, opts, strict=True)
        ]
        done = stage_done.signature(
            kwargs={"quantum_run_id": d.quantum_run_id, "stage_index": d.stage_index},
            immutable=True,
            options={"ignore_result": True},
        )
        return chord(group(header), done)
    # The first link starts the chain (immutable: no prior); each later one receives the
    # previous link's SlotResult.
    links: list[Signature] = [
        stage_agent.signature(
            kwargs=dict[str, Any](a), immutable=n == 0, options={**o, "ignore_result": True}
        )
        for n, (a, o) in enumerate(zip(args, opts, strict=True))
    ]
    return links[0] if len(links) == 1 else chain(*links)


def agent_signature(agent_run_id: int) -> Signature:
    """The task that executes one agent run outside any stage (a standalone agent, a
    sub-agent, or the autopilot's planner and contemplator), through the executor seam."""
    from bursts.tasks import agent_execute

    return agent_execute.signature(kwargs={"agent_run_id": agent_run_id}, immutable=True)


def stages_send_unsafe(dispatches: Sequence[StageDispatch]) -> None:
    """Send now (hence `unsafe`: only after commit). A broker outage is logged, not raised:
    the rows say the stage was dispatched, and the safety net sends it again after the grace."""
    for d in dispatches:
        try:
            stage_canvas(d).apply_async()
        except Exception:
            logger.warning(
                "could not send stage %s of run %s to Celery; the safety net will retry",
                d.stage_index,
                d.quantum_run_id,
                exc_info=True,
            )


def stages_send(dispatches: Sequence[StageDispatch]) -> None:
    """Send the stages once the current transaction commits (workers must see the rows)."""
    if dispatches:
        items = list(dispatches)
        transaction.on_commit(lambda: stages_send_unsafe(items))


def tasks_revoke_unsafe(task_ids: Sequence[str]) -> None:
    """Tell the workers to drop these queued tasks (one broadcast). Best effort: a worker that
    is down misses it, and a task that runs anyway finds its agent cancelled and returns."""
    if not task_ids:
        return
    try:
        app.control.revoke(list(task_ids))
    except Exception:
        logger.warning("could not revoke %s queued stage tasks", len(task_ids), exc_info=True)
