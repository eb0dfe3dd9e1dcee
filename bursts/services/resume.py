"""Resuming an agent that waited on the Tether (its pending tool call now has a result)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from bursts.canvas import StageDispatch, stages_send
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.stages import stage_spec
from core.celery import app
from quanta.pipeline_models import StageMode

STANDALONE_TASK = "psychonauts.tasks.execute_agent_run"


def _shifted_start(now: datetime) -> Coalesce:
    waited = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - Coalesce(F("heartbeat_at"), Value(now)),
        output_field=DurationField(),
    )
    return Coalesce(
        ExpressionWrapper(F("started_at") + waited, output_field=DateTimeField()),
        Value(now, output_field=DateTimeField()),
    )


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
    if (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.WAITING).update(
            status=AgentStatus.RUNNING,
            started_at=_shifted_start(now),
            heartbeat_at=now,
            worker="",
        )
        != 1
    ):
        return False
    agent = AgentRun.objects.only("quantum_run_id", "stage_index", "position", "parent_id").get(
        pk=agent_run_id
    )
    if agent.quantum_run_id is None or agent.parent_id is not None:
        transaction.on_commit(lambda: app.send_task(STANDALONE_TASK, args=(agent_run_id,)))
        return True
    run = QuantumRun.objects.only("status", "current_stage", "pipeline_snapshot").get(
        pk=agent.quantum_run_id
    )
    if run.status != RunStatus.RUNNING or run.current_stage != agent.stage_index:
        return True  # the run ended meanwhile (cancelled): nothing to send
    QuantumRun.objects.filter(pk=run.pk).update(dispatched_at=now)
    spec = stage_spec(run)
    if spec["mode"] == StageMode.FAN_OUT:
        positions: tuple[int, ...] = (agent.position,)
    else:
        positions = tuple(range(agent.position, len(spec["agents"])))
    stages_send([StageDispatch(run.pk, agent.stage_index, spec["mode"], positions)])
    return True
