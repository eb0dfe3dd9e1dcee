"""A question tied to a quantum's state is withdrawn, with its reason, when that state changes;
an answer to it is refused. A note on a drift decides nothing."""

from __future__ import annotations

import pytest

from core.models import Event
from quanta.models import Comment, Quantum
from quanta.services import quantum_close, quantum_defer, quantum_reopen
from tether.errors import QuestionWithdrawn
from tether.models import Drift, DriftStatus, Reaching, ReachingStatus
from tether.services import (
    drift_ground,
    drift_note,
    drift_reject,
    reaching_answer,
    reaching_expire,
    reaching_quarantine,
)


def _quarantined(make_quantum) -> tuple[Quantum, Reaching]:
    quantum = make_quantum()
    Quantum.objects.filter(pk=quantum.pk).update(status="blocked")
    reaching = reaching_quarantine(quantum_id=quantum.pk, history="- run 1: error", failures=3)
    return quantum, reaching


@pytest.mark.parametrize(
    "move",
    [
        lambda q: quantum_reopen(quantum_id=q.pk, reason="operator reopened it"),
        lambda q: quantum_close(quantum_id=q.pk, reason="done by hand"),
        lambda q: quantum_defer(quantum_id=q.pk),
    ],
    ids=["reopen", "close", "defer"],
)
def test_a_quarantine_question_is_withdrawn_when_its_quantum_leaves_blocked(db, make_quantum, move):
    quantum, reaching = _quarantined(make_quantum)

    move(quantum)

    reaching.refresh_from_db()
    assert reaching.status == ReachingStatus.WITHDRAWN
    assert f"quantum #{quantum.pk} is" in reaching.withdrawn_reason
    assert Event.objects.filter(
        type="question_withdrawn", payload__reaching_id=reaching.pk
    ).exists()
    assert Comment.objects.filter(
        quantum=quantum, body__contains=f"question #{reaching.pk} was withdrawn"
    ).exists()


def test_an_answer_to_a_withdrawn_question_is_refused_and_reopens_nothing(db, make_quantum):
    quantum, reaching = _quarantined(make_quantum)
    quantum_reopen(quantum_id=quantum.pk)
    Quantum.objects.filter(pk=quantum.pk).update(status="closed")  # merged meanwhile

    with pytest.raises(QuestionWithdrawn, match="withdrawn: quantum"):
        reaching_answer(reaching_id=reaching.pk, text="retry")

    quantum.refresh_from_db()
    assert quantum.status == "closed"
    reaching.refresh_from_db()
    assert reaching.answer == ""


def test_a_timed_out_quarantine_question_is_withdrawn_too(db, make_quantum, settings):
    quantum, reaching = _quarantined(make_quantum)
    Reaching.objects.filter(pk=reaching.pk).update(deadline=reaching.created_at)
    assert reaching_expire(reaching_id=reaching.pk)

    quantum_close(quantum_id=quantum.pk, reason="not needed")

    with pytest.raises(QuestionWithdrawn):
        reaching_answer(reaching_id=reaching.pk, text="retry")
    quantum.refresh_from_db()
    assert quantum.status == "closed"


def test_a_question_stays_while_its_quantum_stays_blocked(db, make_quantum):
    quantum, reaching = _quarantined(make_quantum)
    other = make_quantum(title="another")

    quantum_close(quantum_id=other.pk, reason="unrelated")

    reaching.refresh_from_db()
    assert reaching.status == ReachingStatus.PENDING
    assert reaching_answer(reaching_id=reaching.pk, text="retry").kind == "quarantine"
    quantum.refresh_from_db()
    assert quantum.status == "open"


def _drift(make_quantum) -> Drift:
    quantum = make_quantum()
    return Drift.objects.create(quantum=quantum, assumption="use SQLite")


def test_a_noted_drift_stays_open_and_can_still_be_grounded(db, make_quantum):
    drift = _drift(make_quantum)

    drift_note(drift_id=drift.pk, text="check this next week", by="ada")
    drift_note(drift_id=drift.pk, text="asked the DBA", by="ada")

    drift.refresh_from_db()
    assert drift.status == DriftStatus.OPEN
    assert [n["text"] for n in drift.notes] == ["check this next week", "asked the DBA"]
    assert drift_ground(drift_id=drift.pk, by="ada").status == DriftStatus.GROUNDED
    drift.refresh_from_db()
    assert len(drift.notes) == 2  # the notes outlive the decision


def test_a_noted_drift_can_still_be_rejected(db, make_quantum):
    drift = _drift(make_quantum)
    drift_note(drift_id=drift.pk, text="hmm")

    rejected = drift_reject(drift_id=drift.pk, reason="use Postgres")

    assert rejected.status == DriftStatus.REJECTED and rejected.correction_id is not None


def test_the_tether_page_shows_a_withdrawn_question_with_its_reason(db, make_quantum):
    from core.events import event_message
    from core.live import fragment_render

    quantum, reaching = _quarantined(make_quantum)
    quantum_close(quantum_id=quantum.pk, reason="done by hand")
    event = Event.objects.get(type="question_withdrawn", payload__reaching_id=reaching.pk)

    html = fragment_render(event_message(event), page="tether", params={}, can_operate=True)

    assert f'id="reaching-{reaching.pk}"' in html and "was withdrawn: quantum" in html
    assert f"#{quantum.pk} is closed now" in html
