"""The owner of AgentRun rows: the inserts, updates and state changes of an agent run.

Each state change is a compare-and-set (`UPDATE ... WHERE status = <expected>`) whose row count
tells the caller whether it won. Two statements owned elsewhere write these rows too, each in one
round trip with its owner's rows, and say so: the agent loop's checkpoint
(`psychonauts.runtime.checkpoint`: a run's claim, its phase and counters at each turn, its end) and a run
step's stage beginning (`quantum_runs.quantum_run_stage_begin`: the stage's attempts).

The statements in plain SQL are the hot ones (a slot's start and finish):
Django compiles an ORM UPDATE in more Python time than its round trip takes. Their table and
column names come from the model's metadata.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce

from bursts.models import AGENT_LIVE, AgentPhase, AgentRun, AgentStatus, QuantumRun
from core.sql import rows_insert, sql_names

_A = sql_names(AgentRun)


# --- inserts --------------------------------------------------------------------------------


def agent_runs_create(*, agents: list[AgentRun]) -> None:
    """Insert the attempts a stage begins with (their ids are set on the instances)."""
    rows_insert(AgentRun, agents)


def agent_run_insert(
    *,
    agent_id: str,
    attempt: int,
    quantum_id: int,
    role: str,
    provider: str = "",
    model: str = "",
    context: str = "",
) -> AgentRun:
    """Insert a standalone attempt (no quantum run: the CLI's). IntegrityError when another
    process took that attempt number first."""
    return AgentRun.objects.create(
        agent_id=agent_id,
        attempt=attempt,
        quantum_id=quantum_id,
        role=role,
        provider=provider,
        model=model,
        context=context,
    )


def agent_run_child_get_or_create(
    *, parent: AgentRun, agent_id: str, position: int, role: str, context: str
) -> AgentRun:
    """The sub-agent run `agent_id` of `parent` (same attempt, one level deeper), inserted
    unless a resumed parent made it before."""
    child, _ = AgentRun.objects.get_or_create(
        agent_id=agent_id,
        attempt=parent.attempt,
        defaults={
            "quantum_id": parent.quantum_id,
            "quantum_run_id": parent.quantum_run_id,
            "parent": parent,
            "depth": parent.depth + 1,
            "stage_index": parent.stage_index,
            "position": position,
            "role": role,
            "provider": parent.provider,
            "context": context,
        },
    )
    return child


def agent_run_next_attempt(*, agent: AgentRun) -> None:
    """Insert the attempt after `agent` in its slot; nothing if another delivery of the same
    chain link created it first."""
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
        pass  # agent_id + attempt is unique: the other delivery's row stands


# --- a slot's start and end -------------------------------------------------------------------

# Pending -> running for a first attempt whose id the dispatcher passed, in one statement that
# also checks the run is still at this stage. No row back means "not that simple": the caller
# takes its general path.
_START_DISPATCHED = """
UPDATE {table} AS a
SET {status} = 'running', {started_at} = %(now)s, {heartbeat_at} = %(now)s,
    {worker} = %(worker)s, {context} = COALESCE(%(context)s, a.{context})
FROM {r_table} AS r
WHERE a.{id} = %(id)s AND a.{status} = 'pending' AND r.{r_id} = a.{quantum_run_id}
  AND r.{r_status} = 'running' AND r.{r_current_stage} = a.{stage_index}
RETURNING a.{agent_id}
""".format(**_A, **sql_names(QuantumRun, "r_"))


def agent_run_start_dispatched(
    *, agent_run_id: int, worker: str, now: datetime, context: str | None
) -> str | None:
    """Pending -> running if its run is running at its stage; its agent_id, or None.
    `context`: None keeps the context the attempt was created with."""
    with connection.cursor() as cursor:
        cursor.execute(
            _START_DISPATCHED,
            {"now": now, "worker": worker, "context": context, "id": agent_run_id},
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def agent_run_start(*, agent_run_id: int, context: str, worker: str, now: datetime) -> bool:
    """Pending -> running, with the context it runs with; False if it was not pending."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.PENDING).update(
            status=AgentStatus.RUNNING,
            context=context,
            started_at=now,
            heartbeat_at=now,
            worker=worker,
        )
        == 1
    )


def agent_run_take_over(*, agent_run_id: int, worker: str, now: datetime) -> bool:
    """A running attempt that was resumed (no worker) or whose executor is gone (heartbeat_at
    older than the heartbeat TTL) now runs on `worker`; False if it is no longer running, or
    its executor is alive: the lease of an attempt started by its dispatched task is set by
    the executor's first heartbeat, and until then its fresh heartbeat_at is what says so."""
    stale = now - timedelta(seconds=settings.BURSTS_HEARTBEAT_TTL_S)
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING)
        .filter(Q(worker="") | Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=stale))
        .update(heartbeat_at=now, worker=worker)
        == 1
    )


_FINISH = """
UPDATE {table} SET {status} = %s, {result} = %s, {error} = %s, {finished_at} = %s
WHERE {id} = %s AND {status} = 'running'
""".format(**_A)


def agent_run_finish(
    *, agent_run_id: int, status: str, result: str, error: str, now: datetime
) -> bool:
    """Running -> done | error in one plain statement (the hot path); False if it was no
    longer running (cancelled meanwhile)."""
    with connection.cursor() as cursor:
        cursor.execute(_FINISH, [status, result, error, now, agent_run_id])
        updated: int = cursor.rowcount
    return updated == 1


def agent_run_end(
    *, agent_run_id: int, status: str, result: str, error: str, now: datetime
) -> bool:
    """Live (pending, running, waiting) -> terminal; False if it had already ended."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status__in=AGENT_LIVE).update(
            status=status, result=result, error=error, finished_at=now
        )
        == 1
    )


def agent_run_wait(*, agent_run_id: int, now: datetime) -> bool:
    """Running -> waiting on a tool call answered from outside (the runtime suspends it); False
    if it was no longer running."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING).update(
            status=AgentStatus.WAITING, phase=AgentPhase.WAITING, heartbeat_at=now
        )
        == 1
    )


def agent_run_fail(*, agent_run_id: int, error: str, now: datetime) -> bool:
    """Running -> error before its turn loop got going; False if someone else ended it first."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING).update(
            status=AgentStatus.ERROR, phase=AgentPhase.ERROR, error=error, finished_at=now
        )
        == 1
    )


def agent_run_stop(*, agent_run_id: int, error: str, now: datetime) -> bool:
    """Live -> cancelled: an agent whose parent (or its parent's parent) ended stops with it;
    False if it had ended already."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status__in=AGENT_LIVE).update(
            status=AgentStatus.CANCELLED, phase=AgentPhase.ERROR, error=error, finished_at=now
        )
        == 1
    )


# The first ended agent up a sub-agent's chain of parents (itself excluded), nearest first.
_ANCESTOR_ENDED = """
WITH RECURSIVE up AS (
    SELECT {parent_id} AS id, 1 AS depth FROM {table} WHERE {id} = %(id)s
    UNION ALL
    SELECT a.{parent_id}, up.depth + 1 FROM {table} a JOIN up ON a.{id} = up.id
    WHERE up.depth < 64
)
SELECT a.{agent_id}, a.{status} FROM up JOIN {table} a ON a.{id} = up.id
WHERE a.{status} <> ALL(%(live)s)
ORDER BY up.depth
LIMIT 1
""".format(**_A)


def agent_run_ancestor_ended(*, agent_run_id: int) -> tuple[str, str] | None:
    """(agent id, status) of the nearest ancestor of a sub-agent that has ended, or None while
    every one is live (or the run has no parent)."""
    with connection.cursor() as cursor:
        cursor.execute(_ANCESTOR_ENDED, {"id": agent_run_id, "live": sorted(AGENT_LIVE)})
        row = cursor.fetchone()
    return (str(row[0]), str(row[1])) if row else None


def agent_run_slot_wait(*, agent_run_id: int) -> bool:
    """Running (on a worker) -> waiting on the Tether, as a slot records its agent's outcome. An answer may already have resumed it
    (agent_resume: running, worker cleared): then it stays running, or its resumed task would
    find it waiting and stop; False."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING)
        .exclude(worker="")
        .update(status=AgentStatus.WAITING)
        == 1
    )


def _shifted_start(now: datetime) -> Coalesce:
    waited = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - Coalesce(F("heartbeat_at"), Value(now)),
        output_field=DurationField(),
    )
    return Coalesce(
        ExpressionWrapper(F("started_at") + waited, output_field=DateTimeField()),
        Value(now, output_field=DateTimeField()),
    )


def agent_run_resume(*, agent_run_id: int, now: datetime) -> bool:
    """Waiting -> running with no worker (the task sent next takes it); False if it was not
    waiting. started_at moves forward by the wait, measured from the heartbeat the runtime wrote
    when it suspended: waiting does not count against the role's or the stage's timeout."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.WAITING).update(
            status=AgentStatus.RUNNING,
            started_at=_shifted_start(now),
            heartbeat_at=now,
            worker="",
        )
        == 1
    )


def agent_runs_heartbeat(*, agent_run_ids: Sequence[int], now: datetime) -> None:
    """Stamp heartbeat_at of the attempts this process holds leases on."""
    AgentRun.objects.filter(pk__in=agent_run_ids).update(heartbeat_at=now)


def agent_run_beat(*, agent_run_id: int, phase: str, now: datetime) -> bool:
    """Stamp a running attempt's heartbeat and phase; False when it is no longer running (the
    burst manager cancelled it, or another execution ended it)."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING).update(
            heartbeat_at=now, phase=phase
        )
        == 1
    )


# --- cancelling ---------------------------------------------------------------------------------


def agent_run_time_out(*, agent_run_id: int, error: str, now: datetime) -> bool:
    """Running -> cancelled (past its stage's timeout: it stops at its next turn); False if it
    was no longer running."""
    return (
        AgentRun.objects.filter(pk=agent_run_id, status=AgentStatus.RUNNING).update(
            status=AgentStatus.CANCELLED, error=error, finished_at=now
        )
        == 1
    )


def agent_runs_cancel_pending(
    *,
    quantum_run_id: int,
    error: str,
    now: datetime,
    stage_index: int | None = None,
    position: int | None = None,
) -> int:
    """Pending -> cancelled: the run's attempts that never started (of one stage, of one slot);
    how many."""
    pending = AgentRun.objects.filter(quantum_run_id=quantum_run_id, status=AgentStatus.PENDING)
    if stage_index is not None:
        pending = pending.filter(stage_index=stage_index)
    if position is not None:  # a slot: its attempts, not a sub-agent at the same position
        pending = pending.filter(position=position, parent__isnull=True)
    return pending.update(status=AgentStatus.CANCELLED, error=error, finished_at=now)


def agent_runs_cancel_live(*, quantum_run_ids: Collection[int], error: str, now: datetime) -> int:
    """Live -> cancelled for every attempt of these runs (a running one stops at its next
    turn); how many."""
    return AgentRun.objects.filter(
        quantum_run_id__in=quantum_run_ids, status__in=AGENT_LIVE
    ).update(status=AgentStatus.CANCELLED, error=error, finished_at=now)


__all__ = [
    "agent_run_beat",
    "agent_run_child_get_or_create",
    "agent_run_end",
    "agent_run_fail",
    "agent_run_finish",
    "agent_run_insert",
    "agent_run_next_attempt",
    "agent_run_resume",
    "agent_run_slot_wait",
    "agent_run_start",
    "agent_run_start_dispatched",
    "agent_run_take_over",
    "agent_run_time_out",
    "agent_run_wait",
    "agent_runs_cancel_live",
    "agent_runs_cancel_pending",
    "agent_runs_create",
    "agent_runs_heartbeat",
]
