"""Celery tasks: thin links of the stage canvases and the manager's triggers. They take ids,
by name (`bursts.canvas` builds their signatures). They belong to the project's application
itself, not to Celery's "current" one: a signature built in a thread that never made the
application (a web request's) is sent with its broker and result backend."""

from __future__ import annotations

import logging
from typing import Any

from bursts.executor import OutcomeDict, execute_agent
from bursts.services import SlotResult, run_step, safety_net, slot_run, wave_advance
from core.celery import app

logger = logging.getLogger(__name__)


@app.task(name="bursts.stage_agent", acks_late=True, ignore_result=False)
def stage_agent(
    prior: SlotResult | None = None,
    *,
    quantum_run_id: int,
    stage_index: int,
    position: int,
    final: bool,
    agent_run_id: int | None = None,
) -> SlotResult:
    """One agent of a stage (`bursts.canvas.StageAgentArgs`); a chain's later link receives the
    previous link's result as `prior`. The last link of a chain, or a link that broke it,
    evaluates the stage at once; a fan-out stage is evaluated by its chord callback. The
    executor enters the quantum's repository itself; evaluating a stage needs none."""
    result = slot_run(
        quantum_run_id=quantum_run_id,
        stage_index=stage_index,
        position=position,
        prior=prior,
        agent_run_id=agent_run_id,
    )
    broke_here = (prior is None or prior["status"] == "done") and result["status"] in (
        "error",
        "cancelled",
    )
    if final or broke_here:
        run_step(quantum_run_id=quantum_run_id, stage_index=stage_index)
    return result


@app.task(name="bursts.stage_done", acks_late=True, ignore_result=True)
def stage_done(*, quantum_run_id: int, stage_index: int) -> None:
    """A fan-out stage's chord callback: evaluates the stage (and sends the next one)."""
    run_step(quantum_run_id=quantum_run_id, stage_index=stage_index)


@app.task(
    name="bursts.agent_execute", acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def agent_execute(*, agent_run_id: int) -> OutcomeDict:
    """One agent run outside any stage (standalone, a sub-agent, the autopilot's planner),
    executed through the executor seam. Idempotent: a redelivery resumes from the checkpoint.
    The outcome is the AgentRun row (and its events); nobody waits on this result."""
    outcome = execute_agent(agent_run_id)
    if outcome.status == "error":
        logger.warning("agent run %s ended in error: %s", agent_run_id, outcome.error)
    return outcome.as_dict()


@app.task(name="bursts.wave_advance", acks_late=True, ignore_result=True)
def wave_advance_task(wave_id: int) -> None:
    wave_advance(wave_id=wave_id)


@app.task(name="bursts.safety_net", ignore_result=True)
def safety_net_task() -> dict[str, Any]:
    report = safety_net()
    if report.advanced or report.redispatched or report.timed_out:
        logger.warning("safety net: %s", report)
    return vars(report)
