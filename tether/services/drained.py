"""What the tether does when the burst manager drains runs (bursts.hooks.ON_RUNS_DRAINED).

Called inside the manager's transaction with the wave locked: a few rows at most. Each done
run's review is due in that transaction (its quantum closed with it); the git work of the review
goes to a Celery task after commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from bursts.models import QuantumRun, RunStatus
from tether.services.changes import reviews_due
from tether.services.reachings import reaching_quarantine


def runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """A review of each done run's branch due; a quarantine question for each blocked
    quantum."""
    reviews_due(runs=[(run.pk, run.quantum_id) for run, outcome in drained if outcome == "done"])
    for run, outcome in drained:
        if outcome == "blocked":
            _quarantine(run)


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
