"""Collecting a burst, with the wave locked: claim the ready quanta, match each to a pipeline,
create its run and begin its first stage (the agents start when the transaction commits)."""

from __future__ import annotations

from django.utils import timezone

from bursts.events import BurstEventType, BurstStarted, burst_event, burst_events
from bursts.models import Burst, BurstPhase, QuantumRun, RunStatus, Wave
from bursts.services.bursts import burst_phase_set
from bursts.services.quantum_runs import quantum_run_finish, run_complete_event
from bursts.services.stages import stages_begin
from quanta.models import Quantum
from quanta.pipelines.services import (
    PipelineNotFound,
    pipeline_choose,
    pipeline_snapshot,
    pipelines_list,
)
from quanta.pipelines.spec import PipelineSnapshot
from quanta.selectors import quanta_ready
from quanta.services import quanta_claim


def _failed_here(wave: Wave) -> list[int]:
    """Quanta whose run errored or was cancelled in this wave: not collected again in it."""
    return list(
        wave.runs.filter(status__in=[RunStatus.ERROR, RunStatus.CANCELLED]).values_list(
            "quantum_id", flat=True
        )
    )


def ready_ids(*, wave: Wave, limit: int | None = None) -> list[int]:
    """The quanta the wave would collect now, in its scope."""
    qs = quanta_ready(
        repository_id=wave.repository_id,
        labels=wave.labels,
        exclude_ids=_failed_here(wave),
        limit=limit,
    )
    return list(qs.values_list("pk", flat=True))


def burst_collect(
    *, wave: Wave, burst: Burst, limit: int | None = None, announce: bool = True
) -> int:
    """Claim ready quanta (compare-and-set), match pipelines, create runs, start stage 0; how
    many runs. `limit` caps the claim (the first transaction of a wave); the burst_started event
    is sent once per burst, with its runs so far (`announce`)."""
    claimed = set(quanta_claim(quantum_ids=ready_ids(wave=wave, limit=limit)))
    if not claimed:
        if burst.phase == BurstPhase.COLLECTING:
            burst_phase_set(burst=burst, phase=BurstPhase.RUNNING)
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
        burst_phase_set(burst=burst, phase=BurstPhase.RUNNING)
    if announce:
        burst_event(
            BurstEventType.BURST_STARTED,
            BurstStarted(
                wave_id=wave.pk,
                burst_id=burst.pk,
                number=burst.number,
                runs=[
                    {"run_id": r.pk, "quantum_id": r.quantum_id, "pipeline": r.pipeline_name}
                    for r in runs
                ],
            ),
        )
    for run, status in finished:
        quantum_run_finish(run=run, status=status, reason=run.error_reason)
    for run in runs:
        if run.status == RunStatus.ERROR and run.finished_at is not None and not run.stages:
            burst_events(
                [run_complete_event(run)]
            )  # failed before any stage (e.g. no pipeline): never live
    return len(runs)


__all__ = ["burst_collect", "ready_ids"]
