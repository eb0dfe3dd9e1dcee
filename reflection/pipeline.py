"""The reflection pipeline over one burst: extracting -> proposing -> evaluating -> curating ->
completed, one function per stage (each a Celery task in reflection.tasks, or run in a row by
`reflect_burst`).

Each stage moves the run with a guarded transition, publishes `reflection:<stage>` and stores
its timing and counts on the run; the work itself is in `reflector` (the model reading the
sessions), `extraction` and `curation`. A stage that fails moves the run to `error` with the
reason and returns None: reflection never raises into the wave.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from reflection import curation, extraction, reflector
from reflection.events import reflection_event
from reflection.models import (
    REFLECTION_RUN_TERMINAL,
    DeltaOp,
    ReflectionRun,
    ReflectionRunStatus,
)
from reflection.services import playbook
from reflection.services.runs import reflection_run_start, reflection_run_transition

logger = logging.getLogger(__name__)


# --- helpers ----------------------------------------------------------------------------------


def _stage(run: ReflectionRun, to: str, started: float, **counts: int) -> ReflectionRun:
    timings = {**run.timings, run.status: round(time.monotonic() - started, 4)}
    moved = reflection_run_transition(run.pk, to, timings=timings, counts={**run.counts, **counts})
    reflection_event(
        to,
        "reflection_stage_entered",
        {
            "reflection_run": run.pk,
            "burst": run.burst_id,
            "wave": run.wave_id,
            "status": to,
            "counts": moved.counts,
        },
    )
    return moved


def _guarded(
    stage: str, body: Callable[[ReflectionRun], ReflectionRun]
) -> Callable[[int | None], int | None]:
    """The stage as a function of the run id: it runs only when the run stands at the status
    before `stage`; any exception moves the run to error with the reason, never raised."""

    def run_stage(run_id: int | None) -> int | None:
        if run_id is None:
            return None
        run = ReflectionRun.objects.filter(pk=run_id).first()
        if run is None or run.status in REFLECTION_RUN_TERMINAL or run.status == "error":
            return None
        try:
            return body(run).pk
        except Exception as exc:  # reflection never fails the wave
            logger.exception("reflection %s failed in %s", run_id, stage)
            _fail(run_id, f"{stage}: {type(exc).__name__}: {exc}")
            return None

    run_stage.__name__ = stage
    return run_stage


def _fail(run_id: int, reason: str) -> None:
    try:
        reflection_run_transition(run_id, ReflectionRunStatus.ERROR, error=reason[:2000])
        reflection_event(
            "error", "reflection_stage_entered", {"reflection_run": run_id, "error": reason}
        )
    except Exception:  # already terminal or gone: nothing left to record
        logger.warning("reflection %s: could not record its error %s", run_id, reason)


# --- stages -----------------------------------------------------------------------------------


def _extract(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    run = _stage(run, ReflectionRunStatus.EXTRACTING, started)
    assert run.burst_id is not None
    read = reflector.reflect_sessions(run.burst_id, reflection_run_id=run.pk)
    found, skipped = extraction.findings(run.burst_id)
    return _stage(
        run,
        ReflectionRunStatus.PROPOSING,
        started,
        agent_runs=extraction.agent_runs_count(run.burst_id),
        sessions_read=read.quantum_runs,
        diary_entries=read.entries,
        reflector_errors=read.errors,
        findings=len(found),
        skipped=skipped + read.skipped,
        tokens_in=read.tokens_in,
        tokens_out=read.tokens_out,
    )


def _propose(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    assert run.burst_id is not None
    found, _ = extraction.findings(run.burst_id)
    found += extraction.rejections(*extraction.window(run))
    proposed = 0
    for item in found:
        text, kind = extraction.proposal_text(item)
        playbook.delta_propose(
            op=DeltaOp.ADD,
            text=text,
            kind=kind,
            roles=[item.role],
            evidence_agent_run_ids=item.agent_run_ids,
            evidence_event_ids=extraction.evidence_events(item.agent_run_ids),
            reason=f"from a {item.kind.replace('_', ' ')}",
            reflection_run_id=run.pk,
        )
        proposed += 1
    return _stage(run, ReflectionRunStatus.EVALUATING, started, proposed=proposed)


def _evaluate(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    rejected = curation.gate(run)
    return _stage(run, ReflectionRunStatus.CURATING, started, unsupported=rejected)


def _curate(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    counts = curation.curate(run)
    return _stage(run, ReflectionRunStatus.COMPLETED, started, **counts)


extract = _guarded("extracting", _extract)
propose = _guarded("proposing", _propose)
evaluate = _guarded("evaluating", _evaluate)
curate = _guarded("curating", _curate)
STAGES = (extract, propose, evaluate, curate)


def start(burst_id: int) -> int | None:
    """The run to carry through the stages, or None when the burst was reflected on already
    (its run stays as stored) or is gone. An errored run is started again."""
    try:
        run, created = reflection_run_start(burst_id)
        if run.status == ReflectionRunStatus.ERROR:
            run = reflection_run_transition(run.pk, ReflectionRunStatus.STARTED, error="")
        elif not created:
            return None
        reflection_event(
            "started",
            "reflection_stage_entered",
            {"reflection_run": run.pk, "burst": burst_id, "wave": run.wave_id, "status": "started"},
        )
        return run.pk
    except Exception:  # reflection never fails the wave
        logger.exception("reflection of burst %s could not start", burst_id)
        return None


def reflect_burst(burst_id: int) -> tuple[ReflectionRun | None, bool]:
    """Reflect on the burst in-process, every stage in a row: (its run, cached). `cached` is
    True when the burst had been reflected on already and its stored result is returned."""
    run_id = start(burst_id)
    if run_id is None:
        return ReflectionRun.objects.filter(burst_id=burst_id).first(), True
    for stage in STAGES:
        stage(run_id)
    return ReflectionRun.objects.get(pk=run_id), False
