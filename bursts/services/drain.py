"""Draining: a finished run's outcome applied to its quantum, once, with the wave locked.

done -> the quantum is closed; error -> a comment and back to open (or blocked after N
consecutive failed runs); cancelled -> back to open. Someone who changed the quantum while it
ran (an operator, say) gets a comment saying it was left untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.conf import settings
from django.utils import timezone

from bursts.events import BurstEventType, burst_events
from bursts.hooks import ON_RUNS_DRAINED
from bursts.models import QuantumRun, RunStatus, Wave
from bursts.services.quantum_runs import quantum_runs_mark_drained
from quanta.errors import QuantaError
from quanta.models import QuantumStatus
from quanta.services import comment_add, quanta_close, quantum_release

logger = logging.getLogger(__name__)


def runs_drain(*, wave: Wave, runs: Sequence[QuantumRun]) -> None:
    """Apply finished runs (their bursts loaded) to their quanta, each once.

    A burst of a thousand runs drains while the wave waits, on one worker: the runs are marked
    drained (compare-and-set), their quanta closed and the events written in a few set-wide
    statements instead of a handful per run; only failures, rare, go one by one."""
    if not runs:
        return
    mine = quantum_runs_mark_drained(run_ids=[r.pk for r in runs], now=timezone.now())
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
                BurstEventType.RUN_DRAINED,
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
    drained = [(run, outcomes[run.pk]) for run in runs]
    for hook in ON_RUNS_DRAINED:
        hook(drained)


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


__all__ = ["runs_drain"]
