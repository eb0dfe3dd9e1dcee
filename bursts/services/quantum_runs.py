"""The one writer of QuantumRun rows: their insert, each stage they begin, their end, their
drain mark and their dispatch stamp.

Two statements of a run step write more than the run's row, in one round trip: a stage's
beginning inserts its attempts (AgentRun rows, by the INSERT `core.sql` compiles from the model,
the one `agent_runs.agent_runs_create` runs) and the step's events; a run's end writes its
events. Each is written out whole here, its parameters declared (`core.sql.Statement`).

A run's end and its drain mark are compare-and-sets (`WHERE status = ANY(live)`, `WHERE
drained_at IS NULL`); a stage begins under the run's row lock (the run step) or the wave's (a
collect), so its UPDATE needs no guard. The statements a run step runs once per run are plain
SQL: the ORM compiled them for longer than they ran.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from bursts.events import BurstEvent, BurstEventType, burst_batch
from bursts.models import AgentRun, QuantumRun, RunStatus
from bursts.services.agent_runs import agent_runs_cancel_live, agent_runs_cancel_pending
from core.events import EventParams
from core.sql import Statement, rows_insert_cte, rows_inserted, sql_names

logger = logging.getLogger(__name__)

# Not ended: a run pending its first stage or running one.
LIVE_RUN: frozenset[str] = frozenset({RunStatus.PENDING, RunStatus.RUNNING})

_R = sql_names(QuantumRun)


def quantum_runs_create(*, runs: Sequence[QuantumRun]) -> None:
    """Insert a collect's runs, each with its first stage already set (ids set on them)."""
    QuantumRun.objects.bulk_create(runs, batch_size=500)


_BEGIN_FIELDS = ["current_stage", "stages", "status", "started_at", "dispatched_at", "error_reason"]
_BEGIN = """
UPDATE {table}
SET {current_stage} = %s, {stages} = %s::jsonb, {status} = %s, {started_at} = %s,
    {dispatched_at} = %s, {error_reason} = %s
WHERE {id} = %s
""".format(**_R)


def quantum_runs_begin(*, runs: Sequence[QuantumRun]) -> None:
    """Save the stage each run begins (current_stage, stages, status and times as set on it).
    Call with the runs locked (their own rows, or their wave's)."""
    if len(runs) == 1:
        run = runs[0]
        with connection.cursor() as cursor:
            cursor.execute(
                _BEGIN,
                [
                    run.current_stage,
                    json.dumps(run.stages),
                    run.status,
                    run.started_at,
                    run.dispatched_at,
                    run.error_reason,
                    run.pk,
                ],
            )
    elif runs:
        QuantumRun.objects.bulk_update(runs, _BEGIN_FIELDS, batch_size=100)


class _StageBegin(EventParams):
    run_id: int
    run_stage: int
    run_stages: str  # JSON
    run_status: str
    run_started_at: datetime | None
    run_dispatched_at: datetime | None
    run_error_reason: str


# The run step's write when a stage begins: the stage as `quantum_runs_begin` saves it, the stage's
# attempts (the CTE `agents`, compiled from AgentRun's fields by `core.sql.rows_insert_cte`: the
# same INSERT `agent_runs_create` runs) and the step's events, in one round trip. `{agents}` is
# that CTE, or no row at all for a stage without attempts.
_STAGE_BEGIN = """
WITH run AS (
    UPDATE bursts_quantumrun
    SET current_stage = %(run_stage)s, stages = %(run_stages)s::jsonb, status = %(run_status)s,
        started_at = %(run_started_at)s, dispatched_at = %(run_dispatched_at)s,
        error_reason = %(run_error_reason)s
    WHERE id = %(run_id)s
    RETURNING id
), {agents}, events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    RETURNING id
)
SELECT ARRAY(SELECT id FROM agents ORDER BY id), ARRAY(SELECT id FROM events ORDER BY id)
"""
_NO_AGENTS = "agents AS (SELECT NULL::bigint AS id WHERE false)"
# The statement of a stage without attempts (a skipped one's successor...); with attempts, the
# same text with their INSERT as `agents`.
_STAGE_BEGIN_ALONE = Statement(
    "quantum_run_stage_begin",
    "A run's next stage, its attempts and the step's events.",
    _StageBegin,
    _STAGE_BEGIN.format(agents=_NO_AGENTS),
)


def quantum_run_stage_begin(
    *, run: QuantumRun, agents: list[AgentRun], events: Sequence[BurstEvent]
) -> None:
    """The stage `run` begins (as set on it), its attempts (their ids set on them) and the
    step's events, in one statement. Call with the run locked."""
    batch = burst_batch(events)
    params: _StageBegin = {
        "run_id": run.pk,
        "run_stage": run.current_stage,
        "run_stages": json.dumps(run.stages),
        "run_status": run.status,
        "run_started_at": run.started_at,
        "run_dispatched_at": run.dispatched_at,
        "run_error_reason": run.error_reason,
        **batch.params(),
    }
    if agents:
        cte, agent_params = rows_insert_cte(AgentRun, agents, name="agents")
        values: dict[str, Any] = {**params, **agent_params}
        with connection.cursor() as cursor:
            cursor.execute(_STAGE_BEGIN.format(agents=cte), values)
            row = cursor.fetchone()
        assert row is not None  # a SELECT without FROM always has its row
    else:
        row = _STAGE_BEGIN_ALONE.row(params)
    rows_inserted(agents, row[0])
    batch.sent(row[1])


class _Finish(EventParams):
    id: int
    live: list[str]
    status: str
    reason: str
    now: datetime
    stages: str  # JSON


_FINISH = Statement(
    "quantum_run_finish",
    "Live -> terminal, with its stages and, only if this call ended it, the step's events.",
    _Finish,
    """
WITH run AS (
    UPDATE bursts_quantumrun
    SET status = %(status)s, error_reason = %(reason)s, finished_at = %(now)s,
        stages = %(stages)s::jsonb
    WHERE id = %(id)s AND status = ANY(%(live)s)
    RETURNING id
), events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    WHERE EXISTS (SELECT FROM run)
    RETURNING id
)
SELECT EXISTS (SELECT FROM run), ARRAY(SELECT id FROM events ORDER BY id)
""",
)


def quantum_run_finish(
    *,
    run: QuantumRun,
    status: str,
    reason: str = "",
    announce: bool = True,
    events: Sequence[BurstEvent] = (),
) -> bool:
    """Live -> terminal (compare-and-set), with the stages recorded so far; False if another
    step finished it first. Its `run_completed` event (unless `announce=False`), after the
    caller's `events`, is written in the same statement, only if this call ended the run."""
    now = timezone.now()
    batch = burst_batch(
        [*events, *([run_complete_event(run, status=status, reason=reason)] if announce else [])]
    )
    ended, event_ids = _FINISH.row(
        {
            "status": status,
            "reason": reason,
            "now": now,
            "stages": json.dumps(run.stages),
            "id": run.pk,
            "live": sorted(LIVE_RUN),
            **batch.params(),
        }
    )
    if not ended:
        logger.info("run %s already finished; leaving it", run.pk)
        return False
    batch.sent(event_ids)
    run.status, run.error_reason, run.finished_at = status, reason, now
    if status != RunStatus.DONE:
        # Agents that never started will not: say so instead of leaving them pending.
        agent_runs_cancel_pending(quantum_run_id=run.pk, error=f"not run: {reason}", now=now)
    # Nothing outlives its run: a fan-out sibling still at work when the stage failed, a
    # sub-agent of any depth (they carry the run too) stop at their next turn and commit
    # nothing more.
    agent_runs_cancel_live(
        quantum_run_ids=[run.pk],
        error=f"stopped: the run ended {status}" + (f": {reason}" if reason else ""),
        now=now,
    )
    return True


def run_complete_event(
    run: QuantumRun, *, status: str | None = None, reason: str | None = None
) -> BurstEvent:
    """The run's `run_completed` event: as it ended, or with the end it is about to get."""
    return (
        BurstEventType.RUN_COMPLETED,
        {
            "wave_id": run.wave_id,
            "burst_id": run.burst_id,
            "run_id": run.pk,
            "quantum_id": run.quantum_id,
            "status": run.status if status is None else status,
            "pipeline": run.pipeline_name,
            "reason": run.error_reason if reason is None else reason,
        },
    )


_MARK_DRAINED = """
UPDATE {table} SET {drained_at} = %s
WHERE {id} = ANY(%s) AND {drained_at} IS NULL
RETURNING {id}
""".format(**_R)


def quantum_runs_mark_drained(*, run_ids: Sequence[int], now: datetime) -> set[int]:
    """Mark finished runs drained (compare-and-set); the ids this call marked."""
    with connection.cursor() as cursor:
        cursor.execute(_MARK_DRAINED, [now, list(run_ids)])
        return {row[0] for row in cursor.fetchall()}


def quantum_run_redispatch(*, run_id: int, dispatched_at: datetime | None, now: datetime) -> bool:
    """A running run's stage is sent again: compare-and-set on dispatched_at, so two safety
    nets never re-send the same stage twice; False if the other one (or a step) came first."""
    return (
        QuantumRun.objects.filter(
            pk=run_id, dispatched_at=dispatched_at, status=RunStatus.RUNNING
        ).update(dispatched_at=now)
        == 1
    )


def quantum_run_dispatched(*, run_id: int, now: datetime) -> None:
    """Stamp the time the run's current stage was last sent to Celery."""
    QuantumRun.objects.filter(pk=run_id).update(dispatched_at=now)


__all__ = [
    "LIVE_RUN",
    "quantum_run_dispatched",
    "quantum_run_finish",
    "quantum_run_redispatch",
    "quantum_run_stage_begin",
    "quantum_runs_begin",
    "quantum_runs_create",
    "quantum_runs_mark_drained",
    "run_complete_event",
]
