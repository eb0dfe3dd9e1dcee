"""Writes of the tether app: reachings, drifts, change reviews, pipeline mutations, the sweep."""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.queue import queue_check
from tether.services.changes import (
    change_approve,
    change_reject,
    change_review_create,
    changes_approve,
    changes_approve_low_risk,
    reviews_due,
    reviews_resend_due,
)
from tether.services.corrections import correction_file
from tether.services.drifts import drift_decide, drift_ground, drift_note, drift_reject
from tether.services.mutations import (
    mutation_approve,
    mutation_expire,
    mutation_propose,
    mutation_reject,
    mutations_expire_due,
    proposal_check,
)
from tether.services.reachings import (
    AnswerResult,
    agents_rewake,
    answer_agrees,
    reaching_answer,
    reaching_ask,
    reaching_expire,
    reaching_quarantine,
    reachings_cancel_orphans,
    reachings_expire_due,
)


@dataclass
class SweepReport:
    expired: list[int] = field(default_factory=list)
    mutations_expired: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    woken: list[int] = field(default_factory=list)
    queue_rebuilt: bool = False
    reviews_resent: list[int] = field(default_factory=list)


def tether_sweep() -> SweepReport:
    """The beat safety net: expire what is overdue (a lost timer never strands a run), cancel
    questions nobody waits for, wake agents left waiting, rebuild a queue Redis lost, and send
    again the change reviews whose task was lost."""
    report = SweepReport()
    report.expired = reachings_expire_due()
    report.mutations_expired = mutations_expire_due()
    report.cancelled = reachings_cancel_orphans()
    report.woken = agents_rewake()
    report.queue_rebuilt = queue_check()
    report.reviews_resent = reviews_resend_due()
    return report


__all__ = [
    "AnswerResult",
    "SweepReport",
    "agents_rewake",
    "answer_agrees",
    "change_approve",
    "change_reject",
    "change_review_create",
    "changes_approve",
    "changes_approve_low_risk",
    "correction_file",
    "drift_decide",
    "drift_ground",
    "drift_note",
    "drift_reject",
    "mutation_approve",
    "mutation_expire",
    "mutation_propose",
    "mutation_reject",
    "mutations_expire_due",
    "proposal_check",
    "reaching_answer",
    "reaching_ask",
    "reaching_expire",
    "reaching_quarantine",
    "reachings_cancel_orphans",
    "reachings_expire_due",
    "reviews_due",
    "reviews_resend_due",
    "tether_sweep",
]
