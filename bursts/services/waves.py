"""Waves, and the one writer of Wave rows: collect -> run -> drain, burst after burst, until
nothing is ready.

Every wave-level step (collect, drain, close a burst, end or cancel the wave) runs with the
wave's row locked (`SELECT ... FOR UPDATE`), so exactly one manager acts on a wave at a time
whichever worker, command or beat tick triggered it; and every step reads the state it acts on
after taking the lock, so a double trigger finds nothing to do. A run advancing from stage to
stage only locks its own row (`bursts.services.runs`; lock order: wave, then runs).

Two ways to progress: a batch wave closes a burst barrier (every run of the burst ended) before
it drains the burst and collects the next; a continuous wave keeps one rolling burst, drains
each finished run at once and collects whatever that unblocked.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from bursts.canvas import tasks_revoke_unsafe
from bursts.errors import InvalidWave, WaveNotFound, WaveNotRunning
from bursts.events import BurstEventType, WaveEnded, WaveStarted, burst_event
from bursts.models import (
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
from bursts.services.agent_runs import agent_runs_cancel_live
from bursts.services.bursts import burst_close, burst_open, burst_phase_set
from bursts.services.collect import burst_collect, ready_ids
from bursts.services.drain import runs_drain
from bursts.services.quantum_runs import LIVE_RUN, quantum_run_finish
from bursts.services.stages import stage_record
from core import metrics
from quanta.errors import InvalidQuantum
from quanta.fields import clean_labels
from quanta.pipelines.services import pipelines_ensure_defaults
from repos.services import default_repository_id

# The first burst's first transaction claims at most this many quanta, so the first agents
# start within tens of milliseconds however large the backlog (1,000 runs and their agents
# take ~0.7 s to record); the rest joins the same burst in a second transaction.
FIRST_COLLECT = 32


def _lock_wave(wave_id: int) -> Wave:
    try:
        return Wave.objects.select_for_update().get(pk=wave_id)
    except Wave.DoesNotExist:
        raise WaveNotFound(f"no wave {wave_id}") from None


# --- starting and advancing ---------------------------------------------------------------------


def wave_start(
    *,
    labels: Sequence[str] = (),
    continuous: bool = False,
    max_bursts: int | None = None,
    started_by: str = "",
    repository_id: int | None = None,
) -> Wave:
    """Create a wave and collect its first burst at once (the first agents start on commit).
    It runs the ready quanta of one repository (None: the default one).

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
            repository_id=repository_id if repository_id is not None else default_repository_id(),
            labels=sorted(set(labels)),
            continuous=continuous,
            max_bursts=max_bursts or settings.WAVE_MAX_BURSTS,
            started_by=started_by,
        )
        burst_event(
            BurstEventType.WAVE_STARTED,
            WaveStarted(
                wave_id=wave.pk,
                labels=wave.labels,
                continuous=continuous,
                max_bursts=wave.max_bursts,
            ),
        )
        _wave_progress(_lock_wave(wave.pk), first_collect=FIRST_COLLECT)
    # The first agents are running; now collect the rest of the first burst.
    _collect_rest(wave.pk)
    wave.refresh_from_db()
    return wave


@transaction.atomic
def _collect_rest(wave_id: int) -> None:
    wave = _lock_wave(wave_id)
    if wave.status != WaveStatus.RUNNING:
        return
    burst = wave.bursts.order_by("-number").first()
    if not wave.continuous and burst is not None and burst.phase == BurstPhase.RUNNING:
        burst_collect(wave=wave, burst=burst, announce=False)
    # Then as any trigger would (continuous: collect the rest; a burst whose runs all ended
    # already: drain it and go on).
    _wave_progress(wave)


@transaction.atomic
def wave_advance(*, wave_id: int) -> None:
    """Drain what finished, collect what is ready, end the wave when nothing is. Idempotent."""
    wave = _lock_wave(wave_id)
    if wave.status == WaveStatus.RUNNING:
        _wave_progress(wave)


# --- progress (wave locked) ---------------------------------------------------------------------


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
        if not ready_ids(wave=wave, limit=1):
            _wave_finish(wave, WaveStatus.DONE)
            return
        if wave.burst_count >= wave.max_bursts:
            _wave_finish(
                wave,
                WaveStatus.FAILED,
                error=f"hit the limit of {wave.max_bursts} bursts with quanta still ready",
            )
            return
        burst = _burst_next(wave)
        burst_collect(wave=wave, burst=burst, limit=first_collect)
        first_collect = None


def _progress_continuous(wave: Wave, *, first_collect: int | None = None) -> None:
    # One rolling burst: a finished run is drained at once, and whatever that unblocked starts.
    # Runs end without the wave's lock: one may end after the drain below and before the check
    # for live runs, so the wave ends only once no run is live and none waits to be drained.
    burst = wave.bursts.order_by("-number").first() or _burst_next(wave)
    while True:
        _drain_finished(wave)
        collected = burst_collect(wave=wave, burst=burst, limit=first_collect)
        if first_collect and collected:
            return  # the caller collects the rest at once, in its own transaction
        if wave.runs.filter(status__in=LIVE_RUN).exists():
            return  # each run that ends triggers the next step
        if not wave.runs.filter(drained_at__isnull=True).exists():
            break
    burst_close(burst=burst)
    _wave_finish(wave, WaveStatus.DONE)


def _burst_next(wave: Wave) -> Burst:
    wave.burst_count += 1
    wave.save(update_fields=["burst_count"])
    return burst_open(wave=wave, number=wave.burst_count)


def _burst_drain(wave: Wave, burst: Burst) -> None:
    burst_phase_set(burst=burst, phase=BurstPhase.DRAINING)
    _drain(wave, burst.runs.filter(drained_at__isnull=True))
    burst_close(burst=burst)


def _drain_finished(wave: Wave) -> None:
    """Drain every run of the wave that ended and was not drained yet."""
    _drain(wave, wave.runs.filter(status__in=RUN_TERMINAL, drained_at__isnull=True))


# A drain reads its runs this many at a time, without their pipeline and stage records (which
# it does not read), so a burst of 10,000 runs holds no more of them in memory than a burst of
# 1,000.
DRAIN_CHUNK = 1_000


def _drain(wave: Wave, runs: QuerySet[QuantumRun]) -> None:
    chunk: list[QuantumRun] = []
    for run in (
        runs.select_related("burst")
        .defer("pipeline_snapshot", "stages")
        .iterator(chunk_size=DRAIN_CHUNK)
    ):
        chunk.append(run)
        if len(chunk) == DRAIN_CHUNK:
            runs_drain(wave=wave, runs=chunk)
            chunk = []
    runs_drain(wave=wave, runs=chunk)


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
    metrics.wave_finished(status=status, seconds=(now - wave.started_at).total_seconds())
    wave.stats = wave_stats(wave)
    wave.save(update_fields=["stats"])
    burst_event(
        BurstEventType.WAVE_CANCELLED
        if status == WaveStatus.CANCELLED
        else BurstEventType.WAVE_COMPLETED,
        WaveEnded(wave_id=wave.pk, status=status, error=error, stats=wave.stats),
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
    agent_runs_cancel_live(quantum_run_ids=[run.pk for run in live], error=reason, now=now)
    transaction.on_commit(lambda: tasks_revoke_unsafe(queued))
    for run in live:
        if run.stages:
            stage_record(run, run.current_stage, "cancelled", reason)
        quantum_run_finish(run=run, status=RunStatus.CANCELLED, reason=reason)
    _drain_finished(wave)
    for burst in wave.bursts.exclude(phase=BurstPhase.DONE):
        burst_close(burst=burst)
    _wave_finish(wave, WaveStatus.CANCELLED, error=reason)
    return wave


def waves_running_ids() -> list[int]:
    return list(Wave.objects.filter(status=WaveStatus.RUNNING).values_list("pk", flat=True))


__all__ = [
    "FIRST_COLLECT",
    "wave_advance",
    "wave_cancel",
    "wave_start",
    "waves_running_ids",
]
