"""The run step: a stage of a run finished; evaluate it and advance, finish or wait.

A run advances from stage to stage under its own row lock, not its wave's: runs of one wave
advance in parallel (lock order: wave, then runs). Only a finished run takes the wave lock, in a
second transaction, to let the wave progress.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

from django.db import connection, transaction

from bursts.events import BurstEvent, BurstEventType
from bursts.models import RUN_TERMINAL, AgentRun, QuantumRun, RunStatus, Wave, WaveStatus
from bursts.services.quantum_runs import LIVE_RUN, quantum_run_finish, quantum_run_stage_begin
from bursts.services.stages import (
    StagePlan,
    StageStatus,
    stage_evaluate,
    stage_record,
    stage_spec,
    stages_dispatch,
    stages_plan,
)
from bursts.services.waves import wave_advance
from core.sql import sql_names
from quanta.models import Quantum


def run_step(*, quantum_run_id: int, stage_index: int | None = None) -> StageStatus | None:
    """Evaluate the run's current stage and act: wait, advance, finish; a finished run then
    lets the wave progress (drain it in continuous mode, or close the burst barrier). A stale
    or repeated trigger does nothing.

    The run advances under its own row lock, not the wave's: runs of one wave advance in
    parallel. Only a finished run takes the wave lock, in a second transaction after the
    first commits; if the worker dies in between, the safety net advances the wave.
    """
    status, finished = _run_advance(quantum_run_id, stage_index)
    if finished is not None:
        _wave_nudge(finished)
    return status


# The run's columns a step reads, in this order at the head of the statement's row.
_STEP_RUN_COLUMNS = (
    *("id", "status", "current_stage", "pipeline_snapshot", "stages", "started_at"),
    *("dispatched_at", "error_reason", "wave_id", "burst_id", "quantum_id", "pipeline_name"),
)
_R = sql_names(QuantumRun, "r_")
_W = sql_names(Wave, "w_")
_Q = sql_names(Quantum, "q_")
_A = sql_names(AgentRun, "a_")

# A run step reads its run (locked: two triggers of one run serialise here, and wave_cancel,
# which takes the wave lock and then the live runs' locks, waits for a step in flight), the
# wave's status, what conditions read of the quantum, whether the quantum ran before (its
# agent attempts then continue from there) and the agent rows of the stages so far. One
# statement: compiling the ORM's version with select_related, only and an Exists annotation
# cost more than the whole round trip. The agent rows come from the statement's snapshot: one
# that waited for the lock may miss what the holder wrote, but that holder was a step of this
# same run (the row then shows its new stage, and this trigger is stale), and every agent
# finish that triggered this step committed before the trigger was sent. Sub-agents (a parent)
# share their parent's run and stage but hold no slot of it: they are left out.
_RUN_FOR_STEP = """
SELECT {run_columns},
       w.{w_status}, w.{w_continuous},
       q.{q_labels}, q.{q_kind}, q.{q_complexity}, q.{q_priority}, q.{q_title},
       EXISTS (SELECT 1 FROM {r_table} o
               WHERE o.{r_quantum_id} = r.{r_quantum_id} AND o.{r_id} <> r.{r_id}) AS earlier,
       (SELECT COALESCE(json_agg(json_build_array(a.{a_id}, a.{a_agent_id}, a.{a_attempt},
                                                  a.{a_stage_index}, a.{a_position},
                                                  a.{a_status}, a.{a_error}, a.{a_result})),
                        '[]')
        FROM {a_table} a
        WHERE a.{a_quantum_run_id} = r.{r_id} AND a.{a_stage_index} <= r.{r_current_stage}
          AND a.{a_parent_id} IS NULL)
FROM {r_table} r
JOIN {w_table} w ON w.{w_id} = r.{r_wave_id}
JOIN {q_table} q ON q.{q_id} = r.{r_quantum_id}
WHERE r.{r_id} = %s
FOR UPDATE OF r
""".format(
    run_columns=", ".join(f"r.{_R['r_' + name]}" for name in _STEP_RUN_COLUMNS),
    **_R,
    **_W,
    **_Q,
    **_A,
)


@cache
def _step_run_attnames() -> tuple[str, ...]:
    """The step's run columns in model field order, as `Model.from_db` wants them."""
    return tuple(
        f.attname for f in QuantumRun._meta.concrete_fields if f.attname in _STEP_RUN_COLUMNS
    )


class StepAgent(NamedTuple):
    """An agent row as a run step reads it (a model instance costs more to build than the
    step's statement takes)."""

    pk: int
    agent_id: str
    attempt: int
    stage_index: int
    position: int
    status: str
    error: str
    result: str


@dataclass(frozen=True)
class _StepRun:
    """What a run step read: the run (its wave's status and its quantum's condition fields
    loaded), its agent rows so far, and whether its quantum ran before."""

    run: QuantumRun
    agents: list[StepAgent]
    earlier: bool


def _run_locked(quantum_run_id: int) -> _StepRun | None:
    # A plain cursor: a RawQuerySet built the same objects at three times the CPU.
    with connection.cursor() as cursor:
        cursor.execute(_RUN_FOR_STEP, [quantum_run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    got = dict(zip(_STEP_RUN_COLUMNS, row[: len(_STEP_RUN_COLUMNS)], strict=True))
    got["pipeline_snapshot"] = json.loads(got["pipeline_snapshot"])
    got["stages"] = json.loads(got["stages"])
    names = _step_run_attnames()
    run = QuantumRun.from_db(connection.alias, names, [got[n] for n in names])
    (
        wave_status,
        wave_continuous,
        q_labels,
        q_kind,
        q_complexity,
        q_priority,
        q_title,
        earlier,
        agent_rows,
    ) = row[len(_STEP_RUN_COLUMNS) :]
    agents = [StepAgent(*row) for row in agent_rows]
    run.wave = Wave(pk=run.wave_id, status=wave_status, continuous=wave_continuous)
    run.quantum = Quantum(
        pk=run.quantum_id,
        labels=q_labels,
        kind=q_kind,
        complexity=q_complexity,
        priority=q_priority,
        title=q_title,
    )
    return _StepRun(run=run, agents=agents, earlier=bool(earlier))


@transaction.atomic
def _run_advance(
    quantum_run_id: int, stage_index: int | None
) -> tuple[StageStatus | None, QuantumRun | None]:
    locked = _run_locked(quantum_run_id)
    if locked is None:
        return None, None
    run, agents = locked.run, locked.agents
    if run.status != RunStatus.RUNNING or run.wave.status != WaveStatus.RUNNING:
        return None, None
    if stage_index is not None and run.current_stage != stage_index:
        return None, None
    verdict = stage_evaluate(run, agents)
    if verdict.status == StageStatus.IN_PROGRESS:
        return verdict.status, None
    index = run.current_stage
    name = stage_spec(run)["name"]
    stage_record(run, index, verdict.status, verdict.reason)
    plan: StagePlan | None = None
    end: tuple[str, str] | None = None  # how the run ends here: (status, reason)
    if verdict.status == StageStatus.ALL_SUCCEEDED:
        plan = stages_plan(
            [(run, index + 1)],
            {run.quantum_id: run.quantum},
            loaded={run.pk: agents},
            first_runs=() if locked.earlier else (run.pk,),
        )
        if plan.finished:  # no stage left to run
            end = (plan.finished[0][1], run.error_reason)
    else:
        end = (RunStatus.ERROR, f"stage {index} {name}: {verdict.status}: {verdict.reason}")
    # One event per transition: the stage that ended and the one that started (if any), then
    # the run's end; written with the run's own row.
    started = run.status == RunStatus.RUNNING and run.current_stage != index
    events: list[BurstEvent] = [
        (
            BurstEventType.STAGE_COMPLETED,
            {
                "wave_id": run.wave_id,
                "run_id": run.pk,
                "quantum_id": run.quantum_id,
                "stage": index,
                "name": name,
                "status": str(verdict.status),
                "reason": verdict.reason,
                "next_stage": stage_spec(run)["name"] if started else None,
                "skipped": [
                    e["name"] for e in run.stages if e["status"] == "skipped" and e["index"] > index
                ],
            },
        )
    ]
    if end is not None:
        quantum_run_finish(run=run, status=end[0], reason=end[1], events=events)
    elif plan is not None:
        _stage_begin(run, plan, events)
    return verdict.status, run if run.status in RUN_TERMINAL else None


def _stage_begin(run: QuantumRun, plan: StagePlan, events: list[BurstEvent]) -> None:
    """The run's next stage, its attempts and the step's events, in one statement (the run is
    locked); the stage is sent once the transaction commits."""
    quantum_run_stage_begin(run=run, agents=plan.agents, events=events)
    stages_dispatch(plan)


def _wave_nudge(run: QuantumRun) -> None:
    """A run finished: let the wave progress, unless its burst still has live runs (batch
    mode). Checked after the run's own commit, so of runs finishing together the last to
    commit always sees the others finished and advances the wave."""
    if run.wave.continuous or not _burst_live(run.burst_id):
        wave_advance(wave_id=run.wave_id)


# Asked once per finished run: plain SQL (the ORM's exists() compiled for longer than it ran).
_BURST_LIVE = """
SELECT EXISTS (SELECT 1 FROM {r_table} WHERE {r_burst_id} = %s AND {r_status} = ANY(%s))
""".format(**_R)


def _burst_live(burst_id: int | None) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_BURST_LIVE, [burst_id, sorted(LIVE_RUN)])
        row = cursor.fetchone()
    return bool(row and row[0])


__all__ = ["run_step"]
