"""One agent slot of a stage, as a chain or chord link runs it: context, execute, record, retry.

A slot is (run, stage, position); its attempts are AgentRun rows. Running a slot is idempotent:
a finished attempt is returned as it is, an attempt another worker holds (its lease is alive)
is left alone, and a failed attempt with retries left gets a new attempt row.
"""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from django.utils import timezone

from bursts.executor import Outcome, execute_agent
from bursts.leases import AgentLease
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.agent_runs import (
    agent_run_end,
    agent_run_finish,
    agent_run_next_attempt,
    agent_run_slot_wait,
    agent_run_start,
    agent_run_start_dispatched,
    agent_run_take_over,
    agent_runs_cancel_pending,
)
from bursts.services.stages import agent_context, prior_results_context, stage_spec
from core.workers import worker_name

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
    cancelled it meanwhile: keep what is there). A stale execution records nothing: the run is
    another execution's now."""
    if outcome.status == "stale":
        agent.refresh_from_db()
        return agent
    if outcome.status == "waiting":
        if agent_run_slot_wait(agent_run_id=agent.pk):
            agent.status = AgentStatus.WAITING
            return agent
    else:
        now = timezone.now()
        if agent_run_end(
            agent_run_id=agent.pk,
            status=outcome.status,
            result=outcome.result,
            error=outcome.error,
            now=now,
        ):
            agent.status, agent.result, agent.error, agent.finished_at = (
                outcome.status,
                outcome.result,
                outcome.error,
                now,
            )
            return agent
    agent.refresh_from_db()
    return agent


def _finish(agent: AgentRun, outcome: Outcome) -> bool:
    """running -> done | error, as `_record` does, in one plain statement (the hot path)."""
    now = timezone.now()
    if not agent_run_finish(
        agent_run_id=agent.pk,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error,
        now=now,
    ):
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
    # A fan-out agent or a chain's first link got its context when its stage began; a later
    # link adds the earlier links of its own stage.
    context = (
        None
        if prior is None
        else prior_results_context(quantum_run_id, stage_index, before_position=position)
    )
    # Pending -> running in one statement that also checks the run is still at this stage: the
    # compare-and-set of the general path, without its three look-ups. Winning it is the claim:
    # the lease is then only registered with the heartbeat (AgentLease `claimed`).
    agent_id = agent_run_start_dispatched(
        agent_run_id=agent_run_id,
        worker=worker_name(),
        now=timezone.now(),
        context=context,
    )
    if agent_id is None:
        return None  # not that simple: the general path decides
    with AgentLease(agent_run_id, claimed=True) as lease:
        agent = AgentRun(
            pk=agent_run_id,
            agent_id=agent_id,
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
            agent_runs_cancel_pending(
                quantum_run_id=quantum_run_id,
                stage_index=stage_index,
                position=position,
                error=f"not run: the chain broke at {prior['agent_id']}",
                now=timezone.now(),
            )
        return prior
    allowed = 1 + spec["retries"]
    while True:
        attempts = list(
            AgentRun.objects.filter(
                quantum_run_id=quantum_run_id,
                stage_index=stage_index,
                position=position,
                parent__isnull=True,  # a sub-agent at this position is not the slot's
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
                agent_run_next_attempt(agent=agent)
                continue
            return _result(agent, agent.status)  # type: ignore[arg-type]
        resumed = agent.status == AgentStatus.RUNNING and not agent.worker
        with AgentLease(agent.pk, wait_s=RESUME_LEASE_WAIT_S if resumed else 0.0) as lease:
            if not lease.held:
                return _result(agent, "busy")
            now = timezone.now()
            if agent.status == AgentStatus.PENDING:
                started = agent_run_start(
                    agent_run_id=agent.pk,
                    context=agent_context(agent, spec["mode"]),
                    worker=worker_name(),
                    now=now,
                )
            else:  # resuming an attempt whose worker died
                started = agent_run_take_over(agent_run_id=agent.pk, worker=worker_name(), now=now)
            if not started:
                agent.refresh_from_db(fields=["status"])
                if agent.status == AgentStatus.RUNNING:
                    return _result(agent, "busy")  # its executor is alive (fresh heartbeat)
                continue  # cancelled (or finished) while we took the lease: look again
            outcome = execute_agent(agent.pk)
            agent = _record(agent, outcome)
        if agent.status in (AgentStatus.DONE, AgentStatus.WAITING):
            return _result(agent, agent.status)  # type: ignore[arg-type]
        if agent.status == AgentStatus.RUNNING:
            return _result(agent, "waiting")  # answered meanwhile: the resumed task carries on
        # error or cancelled: the loop decides between a retry and giving up.
