"""Resuming an agent that waited on the Tether (its pending tool call now has a result)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from bursts.canvas import StageDispatch, agent_signature, stages_send
from bursts.models import AgentRun, QuantumRun, RunStatus
from bursts.services.agent_runs import agent_run_resume
from bursts.services.quantum_runs import quantum_run_dispatched
from bursts.services.stages import stage_spec
from quanta.pipeline_models import StageMode


def agent_resume(*, agent_run_id: int) -> bool:
    """Wake an agent that waited on the Tether, once its pending tool call has a result.

    Compare-and-set waiting -> running: of two callers (an answer racing a timeout) exactly one
    gets True, and only it sends work to Celery, on commit. A pipeline agent's slot is sent again
    (for a chain, with the links after it; for a fan-out, alone, with the stage's callback); a
    standalone agent (CLI) or a sub-agent (its parent's thread is gone) gets its own task. The
    run resumes from its checkpoint. If the message is lost, the safety net finds a running agent
    with no lease and no heartbeat and sends it again.

    Time spent waiting does not count against the role's or the stage's timeout (both measure
    from started_at): started_at moves forward by the wait, measured from the heartbeat the
    runtime wrote when it suspended. Call inside the transaction that recorded the answer.
    """
    now = timezone.now()
    if not agent_run_resume(agent_run_id=agent_run_id, now=now):
        return False
    quantum_run_id, stage_index, position, parent_id = AgentRun.objects.values_list(
        "quantum_run_id", "stage_index", "position", "parent_id"
    ).get(pk=agent_run_id)
    if quantum_run_id is None or parent_id is not None:
        transaction.on_commit(lambda: agent_signature(agent_run_id).apply_async())
        return True
    run = QuantumRun.objects.only("status", "current_stage", "pipeline_snapshot").get(
        pk=quantum_run_id
    )
    if run.status != RunStatus.RUNNING or run.current_stage != stage_index:
        return True  # the run ended meanwhile (cancelled): nothing to send
    quantum_run_dispatched(run_id=run.pk, now=now)
    spec = stage_spec(run)
    if spec["mode"] == StageMode.FAN_OUT:
        positions: tuple[int, ...] = (position,)
    else:
        positions = tuple(range(position, len(spec["agents"])))
    stages_send([StageDispatch(run.pk, stage_index, spec["mode"], positions)])
    return True
