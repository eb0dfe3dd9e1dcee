"""What the tether does when the burst manager drains runs (bursts.hooks.ON_RUNS_DRAINED) and
when quanta change status (quanta.hooks.ON_STATUS_CHANGED), and the auto-merge policies apps
above tether register (AUTO_MERGE_POLICIES).

Called inside the manager's transaction with the wave locked: a few rows at most. Each done
run's review is due in that transaction (its quantum closed with it); the git work of the review
goes to a Celery task after commit.

The services are imported when a hook is first called, not when the apps load: every process
registers these hooks, and a command that never drains a run (`tether questions`) then loads
none of the services (the bursts, psychonauts and git layers beneath them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bursts.models import QuantumRun, RunStatus

# Policies that auto-merge more low-risk changes than settings.TETHER_AUTO_MERGE_LOW_RISK does:
# each gets the changed quantum's labels (the autopilot registers one for its own quanta).
AUTO_MERGE_POLICIES: list[Callable[[Sequence[str]], bool]] = []


def reachings_withdraw_for_status(quantum_ids: Sequence[int], to: str) -> list[int]:
    """tether.services.reachings.reachings_withdraw_for_status, loaded on first call."""
    from tether.services.reachings import reachings_withdraw_for_status as withdraw

    return withdraw(quantum_ids, to)


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """A review of each done run's branch due; a quarantine question for each blocked
    quantum."""
    from tether.services import reviews_due

    reviews_due(runs=[(run.pk, run.quantum_id) for run, outcome in drained if outcome == "done"])
    for run, outcome in drained:
        if outcome == "blocked":
            _quarantine(run)


def _quarantine(run: QuantumRun) -> None:
    """The quantum was blocked after its failed runs: ask the Tether, with its recent runs."""
    from tether.services import reaching_quarantine

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
