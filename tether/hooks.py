"""What the tether does when the burst manager drains a run (bursts.hooks.ON_RUN_DRAINED).

Called inside the manager's transaction with the wave locked: a few rows at most, and the git
work of a change review goes to a Celery task after commit.
"""

from __future__ import annotations

from django.db import transaction

from bursts.models import QuantumRun, RunStatus
from core.celery import app
from tether.services import reaching_quarantine

REVIEW_TASK = "tether.change_review_create"


def on_run_drained(run: QuantumRun, quantum_outcome: str) -> None:
    if quantum_outcome == "done":
        run_id = run.pk
        transaction.on_commit(lambda: app.send_task(REVIEW_TASK, args=(run_id,)))
    elif quantum_outcome == "blocked":
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
