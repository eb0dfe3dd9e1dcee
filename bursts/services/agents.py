"""One agent slot of a stage, as a chain or chord link runs it: context, execute, record, retry.

A slot is (run, stage, position); its attempts are AgentRun rows. Running a slot is idempotent:
a finished attempt is returned as it is, an attempt another worker holds (its lease is alive)
is left alone, and a failed attempt with retries left gets a new attempt row.
"""

from __future__ import annotations

import logging
import socket
from typing import Literal, TypedDict

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from bursts.executor import Outcome, execute_agent
from bursts.leases import AgentLease
from bursts.models import AGENT_LIVE, AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.stages import agent_context, prior_results_context, stage_spec

logger = logging.getLogger(__name__)

# A resumed agent (agent_resume: running, no worker yet) may reach a worker before the one it
# suspended on has released its lease: wait that long for the lease instead of giving up "busy".
RESUME_LEASE_WAIT_S = 5.0

SlotStatus = Literal["done", "error", "cancelled", "waiting", "busy", "stale"]


class SlotResult(TypedDict):
    """What a chain link hands to the next one (and returns to Celery)."""

    status: SlotStatus
    agent_run_id: int | None
    agent_id: str
    result: str


def _result(agent: AgentRun | None, status: SlotStatus) -> SlotResult:
    return {
        "status": status,
        "agent_run_id": agent.pk if agent else None,
        "agent_id": agent.agent_id if agent else "",
        "result": agent.result if agent and status == "done" else "",
    }


def _record(agent: AgentRun, outcome: Outcome) -> AgentRun:
    """Write the outcome unless the attempt already ended (the runtime wrote it, or the manager
    cancelled it meanwhile: keep what is there)."""
    now = timezone.now()
    if outcome.status == "waiting":
        fields: dict[str, object] = {"status": AgentStatus.WAITING}
        # An answer may already have resumed it (agent_resume: running, worker cleared): then
        # it must stay running, or its resumed task would find it waiting and stop.
        updated = (
            AgentRun.objects.filter(pk=agent.pk, status=AgentStatus.RUNNING)
            .exclude(worker="")
            .update(**fields)
        )
    else:
        fields = {
            "status": outcome.status,
            "result": outcome.result,
            "error": outcome.error,
            "finished_at": now,
        }
        updated = AgentRun.objects.filter(pk=agent.pk, status__in=AGENT_LIVE).update(**fields)
    if updated == 1:
        for name, value in fields.items():
            setattr(agent, name, value)
    else:
        agent.refresh_from_db()
    return agent


def _next_attempt(agent: AgentRun) -> None:
    try:
        with transaction.atomic():
            AgentRun.objects.create(
                agent_id=agent.agent_id,
                attempt=agent.attempt + 1,
                quantum_id=agent.quantum_id,
                quantum_run_id=agent.quantum_run_id,
                stage_index=agent.stage_index,
                position=agent.position,
                role=agent.role,
                provider=agent.provider,
                model=agent.model,
            )
    except IntegrityError:
        pass  # another delivery of this link created it first


# Pending -> running for a first attempt whose id the dispatcher passed, in one statement that
# also checks the run is still at this stage: the compare-and-set of the general path below,
# without its three look-ups. No row back means "not that simple": the general path decides.
_START = """
UPDATE bursts_agentrun AS a
SET status = 'running', started_at = %(now)s, heartbeat_at = %(now)s, worker = %(worker)s,
    context = COALESCE(%(context)s, a.context)
FROM bursts_quantumrun AS r
WHERE a.id = %(id)s AND a.status = 'pending' AND r.id = a.quantum_run_id
  AND r.status = 'running' AND r.current_stage = a.stage_index
RETURNING a.agent_id
"""


_FINISH = """
UPDATE bursts_agentrun SET status = %s, result = %s, error = %s, finished_at = %s
WHERE id = %s AND status = 'running'
"""


def _finish(agent: AgentRun, outcome: Outcome) -> bool:
    """running -> done | error, as `_record` does, in one plain statement (the hot path)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_FINISH, [outcome.status, outcome.result, outcome.error, now, agent.pk])
        if cursor.rowcount != 1:
            return False  # cancelled meanwhile: `_record` reads what is there
    agent.status, agent.result, agent.error, agent.finished_at = (
        outcome.status,
        outcome.result,
        outcome.error,
        now,
    )
    return True


def _slot_fast(
    quantum_run_id: int,
    stage_index: int,
    position: int,
    prior: SlotResult | None,
    agent_run_id: int,
) -> SlotResult | None:
    with AgentLease(agent_run_id) as lease:
        if not lease.held:
            return None
        # A fan-out agent or a chain's first link got its context when its stage began; a later
        # link adds the earlier links of its own stage.
        context = (
            None
            if prior is None
            else prior_results_context(quantum_run_id, stage_index, before_position=position)
        )
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(
                _START,
                {
                    "now": now,
                    "worker": socket.gethostname(),
                    "context": context,
                    "id": agent_run_id,
                },
            )
            row = cursor.fetchone()
        if row is None:
            return None
        agent = AgentRun(
            pk=agent_run_id,
            agent_id=row[0],
            quantum_run_id=quantum_run_id,
            stage_index=stage_index,
            position=position,
            status=AgentStatus.RUNNING,
        )
        outcome = execute_agent(agent_run_id)
        if outcome.status in (AgentStatus.DONE, AgentStatus.ERROR) and _finish(agent, outcome):
            lease.let_expire()
        else:
            agent = _record(agent, outcome)
    if agent.status in (AgentStatus.DONE, AgentStatus.WAITING):
        return _result(agent, agent.status)  # type: ignore[arg-type]
    if agent.status == AgentStatus.RUNNING:
        return _result(agent, "waiting")  # answered meanwhile: the resumed task carries on
    return None  # error or cancelled: the general path retries or gives up


def slot_run(
    *,
    quantum_run_id: int,
    stage_index: int,
    position: int,
    prior: SlotResult | None,
    agent_run_id: int | None = None,
) -> SlotResult:
    """Run one slot to an end: done, error (retries spent), cancelled, waiting (on the Tether),
    busy (another worker has it) or stale (the run moved on or ended)."""
    if agent_run_id is not None and (prior is None or prior["status"] == "done"):
        fast = _slot_fast(quantum_run_id, stage_index, position, prior, agent_run_id)
        if fast is not None:
            return fast
    run = (
        QuantumRun.objects.filter(pk=quantum_run_id)
        .only("status", "current_stage", "pipeline_snapshot")
        .first()
    )
    if run is None or run.status != RunStatus.RUNNING or run.current_stage != stage_index:
        return _result(None, "stale")
    spec = stage_spec(run, stage_index)
    if prior is not None and prior["status"] != "done":
        # The chain is broken (a failed agent) or paused (waiting, busy): do not start this one.
        if prior["status"] in ("error", "cancelled"):
            AgentRun.objects.filter(
                quantum_run_id=quantum_run_id,
                stage_index=stage_index,
                position=position,
                status=AgentStatus.PENDING,
            ).update(
                status=AgentStatus.CANCELLED,
                error=f"not run: the chain broke at {prior['agent_id']}",
                finished_at=timezone.now(),
            )
        return prior
    allowed = 1 + spec["retries"]
    while True:
        attempts = list(
            AgentRun.objects.filter(
                quantum_run_id=quantum_run_id, stage_index=stage_index, position=position
            ).order_by("attempt")
        )
        if not attempts:
            return _result(None, "stale")
        agent = attempts[-1]
        if agent.status == AgentStatus.DONE:
            return _result(agent, "done")
        if agent.status == AgentStatus.WAITING:
            return _result(agent, "waiting")
        if agent.status in (AgentStatus.ERROR, AgentStatus.CANCELLED):
            still_running = QuantumRun.objects.filter(
                pk=quantum_run_id, status=RunStatus.RUNNING
            ).exists()
            if agent.status == AgentStatus.ERROR and len(attempts) < allowed and still_running:
                logger.info(
                    "retrying %s (attempt %s of %s)", agent.agent_id, len(attempts) + 1, allowed
                )
                _next_attempt(agent)
                continue
            return _result(agent, agent.status)  # type: ignore[arg-type]
        resumed = agent.status == AgentStatus.RUNNING and not agent.worker
        with AgentLease(agent.pk, wait_s=RESUME_LEASE_WAIT_S if resumed else 0.0) as lease:
            if not lease.held:
                return _result(agent, "busy")
            now = timezone.now()
            if agent.status == AgentStatus.PENDING:
                started = AgentRun.objects.filter(pk=agent.pk, status=AgentStatus.PENDING).update(
                    status=AgentStatus.RUNNING,
                    context=agent_context(agent, spec["mode"]),
                    started_at=now,
                    heartbeat_at=now,
                    worker=socket.gethostname(),
                )
            else:  # resuming an attempt whose worker died
                started = AgentRun.objects.filter(pk=agent.pk, status=AgentStatus.RUNNING).update(
                    heartbeat_at=now, worker=socket.gethostname()
                )
            if started != 1:
                continue  # cancelled (or finished) while we took the lease: look again
            outcome = execute_agent(agent.pk)
            agent = _record(agent, outcome)
        if agent.status in (AgentStatus.DONE, AgentStatus.WAITING):
            return _result(agent, agent.status)  # type: ignore[arg-type]
        if agent.status == AgentStatus.RUNNING:
            return _result(agent, "waiting")  # answered meanwhile: the resumed task carries on
        # error or cancelled: the loop decides between a retry and giving up.
