"""The burst manager: collect -> run -> drain, burst after burst, until nothing is ready.

Every wave-level step (collect, drain, close a burst, end or cancel the wave) runs with the
wave's row locked (`SELECT ... FOR UPDATE`), so exactly one manager acts on a wave at a time
whichever worker, command or beat tick triggered it; and every step reads the state it acts on
after taking the lock, so a double trigger finds nothing to do. A run advancing from stage to
stage only locks its own row (lock order: wave, then runs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import cache

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from bursts.canvas import tasks_revoke_unsafe
from bursts.errors import InvalidWave, WaveNotFound, WaveNotRunning
from bursts.events import BurstEvent, burst_event, burst_events
from bursts.hooks import ON_RUN_DRAINED
from bursts.models import (
    AGENT_LIVE,
    RUN_TERMINAL,
    AgentRun,
    AgentStatus,
    Burst,
    BurstPhase,
    QuantumRun,
    RunStatus,
    Wave,
    WaveStatus,
)
from bursts.selectors import wave_stats
from bursts.services.stages import (
    StageStatus,
    stage_evaluate,
    stage_record,
    stage_spec,
    stages_begin,
)
from quanta.errors import InvalidQuantum, QuantaError
from quanta.fields import clean_labels
from quanta.models import Quantum, QuantumStatus
from quanta.pipelines.services import (
    PipelineNotFound,
    pipeline_choose,
    pipeline_snapshot,
    pipelines_ensure_defaults,
    pipelines_list,
)
from quanta.pipelines.spec import PipelineSnapshot
from quanta.selectors import quanta_ready
from quanta.services import comment_add, quanta_claim, quanta_close, quantum_release

logger = logging.getLogger(__name__)

LIVE_RUN: frozenset[str] = frozenset({RunStatus.PENDING, RunStatus.RUNNING})


def _lock_wave(wave_id: int) -> Wave:
    try:
        return Wave.objects.select_for_update().get(pk=wave_id)
    except Wave.DoesNotExist:
        raise WaveNotFound(f"no wave {wave_id}") from None


# --- starting ---------------------------------------------------------------------------------


def wave_start(
    *,
    labels: Sequence[str] = (),
    continuous: bool = False,
    max_bursts: int | None = None,
    started_by: str = "",
) -> Wave:
    """Create a wave and collect its first burst at once (the first agents start on commit).

    `labels` are checked as quanta's labels are (InvalidWave names the first bad one): a label
    no quantum can carry would scope the wave to nothing.
    """
    try:
        labels = clean_labels(list(labels))
    except InvalidQuantum as exc:
        raise InvalidWave(str(exc)) from None
    pipelines_ensure_defaults()
    with transaction.atomic():
        wave = Wave.objects.create(
            labels=sorted(set(labels)),
            continuous=continuous,
            max_bursts=max_bursts or settings.WAVE_MAX_BURSTS,
            started_by=started_by,
        )
        burst_event(
            "wave_start",
            wave_id=wave.pk,
            labels=wave.labels,
            continuous=continuous,
            max_bursts=wave.max_bursts,
        )
        _wave_progress(_lock_wave(wave.pk), first_collect=FIRST_COLLECT)
    # The first agents are running; now collect the rest of the first burst.
    _collect_rest(wave.pk)
    wave.refresh_from_db()
    return wave


# The first burst's first transaction claims at most this many quanta, so the first agents
# start within tens of milliseconds however large the backlog (1,000 runs and their agents
# take ~0.7 s to record); the rest joins the same burst in a second transaction.
FIRST_COLLECT = 32


@transaction.atomic
def _collect_rest(wave_id: int) -> None:
    wave = _lock_wave(wave_id)
    if wave.status != WaveStatus.RUNNING:
        return
    burst = wave.bursts.order_by("-number").first()
    if not wave.continuous and burst is not None and burst.phase == BurstPhase.RUNNING:
        _collect(wave, burst, announce=False)
    # Then as any trigger would (continuous: collect the rest; a burst whose runs all ended
    # already: drain it and go on).
    _wave_progress(wave)


@transaction.atomic
def wave_advance(*, wave_id: int) -> None:
    """Drain what finished, collect what is ready, end the wave when nothing is. Idempotent."""
    wave = _lock_wave(wave_id)
    if wave.status == WaveStatus.RUNNING:
        _wave_progress(wave)


# --- the run step: a stage finished ---------------------------------------------------------


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


# A run step reads its run (locked: two triggers of one run serialise here, and wave_cancel,
# which takes the wave lock and then the live runs' locks, waits for a step in flight), the
# wave's status, what conditions read of the quantum, whether the quantum ran before (its
# agent attempts then continue from there) and the agent rows of the stages so far. One
# statement: compiling the ORM's version with select_related, only and an Exists annotation
# cost more than the whole round trip. The agent rows come from the statement's snapshot: one
# that waited for the lock may miss what the holder wrote, but that holder was a step of this
# same run (the row then shows its new stage, and this trigger is stale), and every agent
# finish that triggered this step committed before the trigger was sent.
_RUN_FOR_STEP = """
SELECT r.id, r.status, r.current_stage, r.pipeline_snapshot, r.stages, r.started_at,
       r.dispatched_at, r.error_reason, r.wave_id, r.burst_id, r.quantum_id, r.pipeline_name,
       w.status AS wave_status, w.continuous AS wave_continuous,
       q.labels AS q_labels, q.kind AS q_kind, q.complexity AS q_complexity,
       q.priority AS q_priority, q.title AS q_title,
       EXISTS (SELECT 1 FROM bursts_quantumrun o
               WHERE o.quantum_id = r.quantum_id AND o.id <> r.id) AS earlier,
       (SELECT COALESCE(json_agg(json_build_array(a.id, a.agent_id, a.attempt, a.stage_index,
                                                  a.position, a.status, a.error, a.result)), '[]')
        FROM bursts_agentrun a
        WHERE a.quantum_run_id = r.id AND a.stage_index <= r.current_stage) AS agent_rows
FROM bursts_quantumrun r
JOIN bursts_wave w ON w.id = r.wave_id
JOIN quanta_quantum q ON q.id = r.quantum_id
WHERE r.id = %s
FOR UPDATE OF r
"""


_STEP_RUN_COLUMNS = (
    *("id", "status", "current_stage", "pipeline_snapshot", "stages", "started_at"),
    *("dispatched_at", "error_reason", "wave_id", "burst_id", "quantum_id", "pipeline_name"),
)


@cache
def _step_run_attnames() -> tuple[str, ...]:
    """The step's run columns in model field order, as `Model.from_db` wants them."""
    return tuple(
        f.attname for f in QuantumRun._meta.concrete_fields if f.attname in _STEP_RUN_COLUMNS
    )


def _run_locked(quantum_run_id: int) -> tuple[QuantumRun, list[AgentRun]] | None:
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
    run.__dict__["earlier"] = earlier
    agents = [
        AgentRun(
            pk=pk,
            quantum_run_id=run.pk,
            agent_id=agent_id,
            attempt=attempt,
            stage_index=stage_index,
            position=position,
            status=status,
            error=error,
            result=result,
        )
        for pk, agent_id, attempt, stage_index, position, status, error, result in agent_rows
    ]
    run.wave = Wave(pk=run.wave_id, status=wave_status, continuous=wave_continuous)
    run.quantum = Quantum(
        pk=run.quantum_id,
        labels=q_labels,
        kind=q_kind,
        complexity=q_complexity,
        priority=q_priority,
        title=q_title,
    )
    return run, agents


@transaction.atomic
def _run_advance(
    quantum_run_id: int, stage_index: int | None
) -> tuple[StageStatus | None, QuantumRun | None]:
    locked = _run_locked(quantum_run_id)
    if locked is None:
        return None, None
    run, agents = locked
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
    ended: list[tuple[QuantumRun, str, str]] = []
    if verdict.status == StageStatus.ALL_SUCCEEDED:
        for finished, status in stages_begin(
            [(run, index + 1)],
            {run.quantum_id: run.quantum},
            loaded={run.pk: agents},
            first_runs=() if run.__dict__["earlier"] else (run.pk,),
        ):
            ended.append((finished, status, finished.error_reason))
    else:
        ended.append(
            (run, RunStatus.ERROR, f"stage {index} {name}: {verdict.status}: {verdict.reason}")
        )
    # One event per transition: the stage that ended and the one that started (if any), then
    # the run's end; written together.
    started = run.status == RunStatus.RUNNING and run.current_stage != index
    events: list[BurstEvent] = [
        (
            "stage_complete",
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
    for finished, status, reason in ended:
        if _run_finish(finished, status, reason, announce=False):
            events.append(_run_complete_event(finished))
    burst_events(events)
    return verdict.status, run if run.status in RUN_TERMINAL else None


def _wave_nudge(run: QuantumRun) -> None:
    """A run finished: let the wave progress, unless its burst still has live runs (batch
    mode). Checked after the run's own commit, so of runs finishing together the last to
    commit always sees the others finished and advances the wave."""
    if run.wave.continuous or not _burst_live(run.burst_id):
        wave_advance(wave_id=run.wave_id)


# Asked once per finished run: plain SQL (the ORM's exists() compiled for longer than it ran).
_BURST_LIVE = """
SELECT EXISTS (SELECT 1 FROM bursts_quantumrun WHERE burst_id = %s AND status = ANY(%s))
"""


def _burst_live(burst_id: int | None) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_BURST_LIVE, [burst_id, sorted(LIVE_RUN)])
        row = cursor.fetchone()
    return bool(row and row[0])


# Once per run, in its last step: plain SQL (the ORM's UPDATE compiled for longer than it ran).
_RUN_FINISH = """
UPDATE bursts_quantumrun SET status = %s, error_reason = %s, finished_at = %s, stages = %s::jsonb
WHERE id = %s AND status = ANY(%s)
"""


def _run_finish(run: QuantumRun, status: str, reason: str = "", *, announce: bool = True) -> bool:
    """Live -> terminal (compare-and-set), with the stages recorded so far; False if another
    step finished it first. `announce=False`: the caller publishes `_run_complete_event`
    together with its own events."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            _RUN_FINISH, [status, reason, now, json.dumps(run.stages), run.pk, sorted(LIVE_RUN)]
        )
        updated = cursor.rowcount
    if updated != 1:
        logger.info("run %s already finished; leaving it", run.pk)
        return False
    run.status, run.error_reason, run.finished_at = status, reason, now
    if status != RunStatus.DONE:
        # Agents that never started will not: say so instead of leaving them pending.
        AgentRun.objects.filter(quantum_run_id=run.pk, status=AgentStatus.PENDING).update(
            status=AgentStatus.CANCELLED, error=f"not run: {reason}", finished_at=now
        )
    if announce:
        burst_events([_run_complete_event(run)])
    return True


def _run_complete_event(run: QuantumRun) -> BurstEvent:
    return (
        "run_complete",
        {
            "wave_id": run.wave_id,
            "burst_id": run.burst_id,
            "run_id": run.pk,
            "quantum_id": run.quantum_id,
            "status": run.status,
            "pipeline": run.pipeline_name,
            "reason": run.error_reason,
        },
    )


# --- wave progress (wave locked) ----------------------------------------------------------------


def _wave_progress(wave: Wave, *, first_collect: int | None = None) -> None:
    if wave.continuous:
        _progress_continuous(wave, first_collect=first_collect)
    else:
        _progress_bursts(wave, first_collect=first_collect)


def _progress_bursts(wave: Wave, *, first_collect: int | None = None) -> None:
    # Each pass closes one burst barrier or collects one burst; a burst whose runs all end at
    # collection (nothing to run) lets the loop go round again. Bounded by max_bursts.
    while wave.status == WaveStatus.RUNNING:
        burst = wave.bursts.order_by("-number").first()
        if burst is not None and burst.phase != BurstPhase.DONE:
            if burst.runs.filter(status__in=LIVE_RUN).exists():
                return
            _burst_drain(wave, burst)
        if not _ready_ids(wave, limit=1):
            _wave_finish(wave, WaveStatus.DONE)
            return
        if wave.burst_count >= wave.max_bursts:
            _wave_finish(
                wave,
                WaveStatus.FAILED,
                error=f"hit the limit of {wave.max_bursts} bursts with quanta still ready",
            )
            return
        burst = _burst_open(wave)
        _collect(wave, burst, limit=first_collect)
        first_collect = None


def _progress_continuous(wave: Wave, *, first_collect: int | None = None) -> None:
    # One rolling burst: a finished run is drained at once, and whatever that unblocked starts.
    burst = wave.bursts.order_by("-number").first() or _burst_open(wave)
    while True:
        _drain_runs(
            wave,
            list(
                wave.runs.filter(status__in=RUN_TERMINAL, drained_at__isnull=True).select_related(
                    "burst"
                )
            ),
        )
        collected = _collect(wave, burst, limit=first_collect)
        if first_collect and collected:
            return  # the caller collects the rest at once, in its own transaction
        if collected == 0 or wave.runs.filter(status__in=LIVE_RUN).exists():
            break
    if not wave.runs.filter(status__in=LIVE_RUN).exists():
        _burst_close(burst)
        _wave_finish(wave, WaveStatus.DONE)


def _burst_open(wave: Wave) -> Burst:
    wave.burst_count += 1
    wave.save(update_fields=["burst_count"])
    return Burst.objects.create(wave=wave, number=wave.burst_count, phase=BurstPhase.COLLECTING)


def _failed_here(wave: Wave) -> list[int]:
    """Quanta whose run errored or was cancelled in this wave: not collected again in it."""
    return list(
        wave.runs.filter(status__in=[RunStatus.ERROR, RunStatus.CANCELLED]).values_list(
            "quantum_id", flat=True
        )
    )


def _ready_ids(wave: Wave, *, limit: int | None = None) -> list[int]:
    qs = quanta_ready(labels=wave.labels, exclude_ids=_failed_here(wave), limit=limit)
    return list(qs.values_list("pk", flat=True))


def _collect(wave: Wave, burst: Burst, *, limit: int | None = None, announce: bool = True) -> int:
    """Claim ready quanta (compare-and-set), match pipelines, create runs, start stage 0.
    `limit` caps the claim (the first transaction of a wave); the burst_start event is sent
    once per burst, with its runs so far (`announce`)."""
    claimed = set(quanta_claim(quantum_ids=_ready_ids(wave, limit=limit)))
    if not claimed:
        if burst.phase == BurstPhase.COLLECTING:
            burst.phase = BurstPhase.RUNNING
            burst.save(update_fields=["phase"])
        return 0
    quanta = {q.pk: q for q in Quantum.objects.filter(pk__in=claimed)}
    ordered = sorted(quanta.values(), key=lambda q: (q.priority, q.created_at, q.pk))
    pipelines = list(pipelines_list())
    snapshots: dict[int, PipelineSnapshot] = {}
    runs: list[QuantumRun] = []
    for quantum in ordered:
        try:
            pipeline = pipeline_choose(quantum=quantum, pipelines=pipelines)
        except PipelineNotFound as exc:
            runs.append(
                QuantumRun(
                    wave=wave,
                    burst=burst,
                    quantum=quantum,
                    status=RunStatus.ERROR,
                    pipeline_name=quantum.pipeline or "?",
                    error_reason=str(exc),
                    finished_at=timezone.now(),
                )
            )
            continue
        if pipeline.pk not in snapshots:
            snapshots[pipeline.pk] = pipeline_snapshot(pipeline)
        runs.append(
            QuantumRun(
                wave=wave,
                burst=burst,
                quantum=quantum,
                pipeline_name=pipeline.name,
                pipeline_version=pipeline.version,
                pipeline_snapshot=dict(snapshots[pipeline.pk]),
            )
        )
    startable = [(r, 0) for r in runs if r.status == RunStatus.PENDING]
    finished = stages_begin(startable, quanta, create=runs)
    if burst.phase != BurstPhase.RUNNING:
        burst.phase = BurstPhase.RUNNING
        burst.save(update_fields=["phase"])
    if announce:
        burst_event(
            "burst_start",
            wave_id=wave.pk,
            burst_id=burst.pk,
            number=burst.number,
            runs=[
                {"run_id": r.pk, "quantum_id": r.quantum_id, "pipeline": r.pipeline_name}
                for r in runs
            ],
        )
    for run, status in finished:
        _run_finish(run, status, run.error_reason)
    for run in runs:
        if run.status == RunStatus.ERROR and run.finished_at is not None and not run.stages:
            burst_events(
                [_run_complete_event(run)]
            )  # failed before any stage (e.g. no pipeline): never live
    return len(runs)


# --- draining -----------------------------------------------------------------------------------


def _burst_drain(wave: Wave, burst: Burst) -> None:
    burst.phase = BurstPhase.DRAINING
    burst.save(update_fields=["phase"])
    _drain_runs(wave, list(burst.runs.filter(drained_at__isnull=True)))
    _burst_close(burst)


def _burst_close(burst: Burst) -> None:
    counts = dict(burst.runs.values("status").annotate(n=Count("id")).values_list("status", "n"))
    burst.phase = BurstPhase.DONE
    burst.finished_at = timezone.now()
    burst.stats = {"runs": sum(counts.values()), **counts}
    burst.save(update_fields=["phase", "finished_at", "stats"])
    burst_event(
        "burst_complete",
        wave_id=burst.wave_id,
        burst_id=burst.pk,
        number=burst.number,
        stats=burst.stats,
    )


def _consecutive_failures(quantum_id: int, limit: int) -> int:
    n = 0
    for status in (
        QuantumRun.objects.filter(quantum_id=quantum_id)
        .exclude(status=RunStatus.CANCELLED)
        .order_by("-created_at", "-id")
        .values_list("status", flat=True)[:limit]
    ):
        if status != RunStatus.ERROR:
            break
        n += 1
    return n


_MARK_DRAINED = """
UPDATE bursts_quantumrun SET drained_at = %s
WHERE id = ANY(%s) AND drained_at IS NULL
RETURNING id
"""


def _drain_runs(wave: Wave, runs: Sequence[QuantumRun]) -> None:
    """Apply finished runs to their quanta, each once: done -> closed; error -> a comment and
    back to open (or blocked after N consecutive failed runs); cancelled -> back to open.

    A burst of a thousand runs drains while the wave waits, on one worker: the runs are marked
    drained (compare-and-set), their quanta closed and the events written in a few set-wide
    statements instead of a handful per run; only failures, rare, go one by one."""
    if not runs:
        return
    with connection.cursor() as cursor:
        cursor.execute(_MARK_DRAINED, [timezone.now(), [r.pk for r in runs]])
        mine = {row[0] for row in cursor.fetchall()}
    runs = [r for r in runs if r.pk in mine]
    outcomes: dict[int, str] = {}
    done = [r for r in runs if r.status == RunStatus.DONE]
    if done:
        reasons = {
            r.quantum_id: f"completed by {_where(wave, r)} through pipeline "
            f"{r.pipeline_name} v{r.pipeline_version}"
            for r in done
        }
        closed = set(
            quanta_close(reasons=reasons, allowed_from=frozenset({QuantumStatus.IN_PROGRESS}))
        )
        for run in done:
            if run.quantum_id in closed:
                outcomes[run.pk] = "done"
            else:
                # Someone changed the quantum while it ran (an operator, say): say so.
                outcomes[run.pk] = _untouched(wave, run, "it is no longer in progress")
    for run in runs:
        if run.status != RunStatus.DONE:
            outcomes[run.pk] = _drain_failed(wave, run)
    burst_events(
        [
            (
                "run_drained",
                {
                    "wave_id": wave.pk,
                    "run_id": run.pk,
                    "quantum_id": run.quantum_id,
                    "status": run.status,
                    "quantum_outcome": outcomes[run.pk],
                },
            )
            for run in runs
        ]
    )
    for run in runs:
        for hook in ON_RUN_DRAINED:
            hook(run, outcomes[run.pk])


def _where(wave: Wave, run: QuantumRun) -> str:
    return f"wave {wave.pk} burst {run.burst.number}"


def _untouched(wave: Wave, run: QuantumRun, why: object) -> str:
    logger.warning("draining run %s: %s", run.pk, why)
    comment_add(
        quantum_id=run.quantum_id,
        body=f"Run {run.pk} ended {run.status} in {_where(wave, run)} but the quantum could not be updated: {why}",
        author="burst-manager",
        author_kind="system",
    )
    return "untouched"


def _drain_failed(wave: Wave, run: QuantumRun) -> str:
    """An errored or cancelled run: its quantum back to open (or blocked) with a comment."""
    where = _where(wave, run)
    try:
        if run.status == RunStatus.ERROR:
            limit = settings.QUANTUM_MAX_CONSECUTIVE_FAILURES
            failures = _consecutive_failures(run.quantum_id, limit)
            message = (
                f"Run {run.pk} failed in {where} (pipeline {run.pipeline_name}): {run.error_reason}"
            )
            if failures >= limit:
                quantum_release(
                    quantum_id=run.quantum_id,
                    to=QuantumStatus.BLOCKED,
                    reason=f"{message}\nBlocked after {failures} consecutive failed runs: "
                    "the Tether decides what happens next.",
                )
                return "blocked"
            quantum_release(quantum_id=run.quantum_id, to=QuantumStatus.OPEN, reason=message)
            return str(run.status)
        quantum_release(
            quantum_id=run.quantum_id,
            to=QuantumStatus.OPEN,
            reason=f"Run {run.pk} was cancelled in {where}: {run.error_reason or 'cancelled'}",
        )
        return str(run.status)
    except QuantaError as exc:
        # Someone changed the quantum while it ran (an operator, say): say so, do not crash.
        return _untouched(wave, run, exc)


# --- ending -------------------------------------------------------------------------------------


def _wave_finish(wave: Wave, status: str, *, error: str = "") -> None:
    now = timezone.now()
    if (
        Wave.objects.filter(pk=wave.pk, status=WaveStatus.RUNNING).update(
            status=status, error=error, finished_at=now
        )
        != 1
    ):
        raise WaveNotRunning(f"wave {wave.pk} already ended")
    wave.status, wave.error, wave.finished_at = status, error, now
    wave.stats = wave_stats(wave)
    wave.save(update_fields=["stats"])
    burst_event(
        "wave_complete" if status != WaveStatus.CANCELLED else "wave_cancelled",
        wave_id=wave.pk,
        status=status,
        error=error,
        stats=wave.stats,
    )


@transaction.atomic
def wave_cancel(*, wave_id: int, reason: str = "cancelled by the operator") -> Wave:
    """Stop dispatching; cancel live runs and agents (a running agent stops at its next turn);
    give every claimed quantum back as open with a comment. The stage tasks of agents that had
    not started are revoked (a chain's later links too: workers drop them when they arrive);
    one that runs anyway (a worker that missed the broadcast) finds its agent cancelled."""
    wave = _lock_wave(wave_id)
    if wave.status != WaveStatus.RUNNING:
        raise WaveNotRunning(f"wave {wave_id} is {wave.status}: nothing to cancel")
    now = timezone.now()
    # Lock the live runs too (after the wave: the one lock order), so a run step in flight
    # finishes first and we act on what it left.
    live = list(
        wave.runs.filter(status__in=LIVE_RUN)
        .select_related("quantum", "burst")
        .select_for_update(of=("self",))
        .order_by("pk")
    )
    # Queued stage tasks are revoked after commit; a running agent stops at its next turn.
    queued = list(
        AgentRun.objects.filter(quantum_run__in=live, status=AgentStatus.PENDING)
        .exclude(task_id="")
        .values_list("task_id", flat=True)
    )
    AgentRun.objects.filter(quantum_run__in=live, status__in=AGENT_LIVE).update(
        status=AgentStatus.CANCELLED, error=reason, finished_at=now
    )
    transaction.on_commit(lambda: tasks_revoke_unsafe(queued))
    for run in live:
        if run.stages:
            stage_record(run, run.current_stage, "cancelled", reason)
        _run_finish(run, RunStatus.CANCELLED, reason)
    _drain_runs(
        wave,
        list(
            wave.runs.filter(status__in=RUN_TERMINAL, drained_at__isnull=True).select_related(
                "burst"
            )
        ),
    )
    for burst in wave.bursts.exclude(phase=BurstPhase.DONE):
        _burst_close(burst)
    _wave_finish(wave, WaveStatus.CANCELLED, error=reason)
    return wave


def waves_running_ids() -> list[int]:
    return list(Wave.objects.filter(status=WaveStatus.RUNNING).values_list("pk", flat=True))


__all__ = [
    "run_step",
    "wave_advance",
    "wave_cancel",
    "wave_start",
    "waves_running_ids",
]
