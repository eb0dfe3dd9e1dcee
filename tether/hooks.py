"""What the tether does when the burst manager drains runs (bursts.hooks.ON_RUNS_DRAINED).

Called inside the manager's transaction with the wave locked: a few rows at most, and the git
work of a change review goes to a Celery task after commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from bursts.models import QuantumRun, RunStatus
from core.celery import app
from tether.services import reaching_quarantine

REVIEW_TASK = "tether.change_review_create"


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """A review of each done run's branch, sent after commit; a quarantine question for each
    blocked quantum."""
    reviewed = [run.pk for run, outcome in drained if outcome == "done"]
    if reviewed:
        transaction.on_commit(lambda: _reviews_send(reviewed))
    for run, outcome in drained:
        if outcome == "blocked":
            _quarantine(run)


def _reviews_send(run_ids: list[int]) -> None:
    for run_id in run_ids:
        app.send_task(REVIEW_TASK, args=(run_id,))


def _quarantine(run: QuantumRun) -> None:
    """The quantum was blocked after its failed runs: ask the Tether, with its recent runs."""
    recent = list(
        QuantumRun.objects.filter(quantum_id=run.quantum_id)
        .order_by("-created_at")
        .values_list("pk", "status", "error_reason", "created_at")[:10]
    )
    failures = 0
    for _, status, _, _ in recent:
        if status != RunStatus.ERROR:
            break
        failures += 1
    history = "\n".join(
        f"- run {pk} ({created:%Y-%m-%d %H:%M:%S}): {status}: {reason or '(no reason)'}"
        for pk, status, reason, created in recent
    )
    reaching_quarantine(
        quantum_id=run.quantum_id, history="## Recent runs\n" + history, failures=failures
    )
