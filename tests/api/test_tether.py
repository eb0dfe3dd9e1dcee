"""The Tether over HTTP: questions listed in queue order and answered; drifts grounded and
rejected; a change shown with its diff, approved into the merge queue, or rejected."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from quanta.models import Quantum
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_quantum
from tests.tether.conftest import tether_settings
from tests.tether.test_changes import finished_run
from tether.models import ChangeReview, Drift, Reaching
from tether.services import change_review_create

pytestmark = pytest.mark.django_db

__all__ = ["tether_settings"]  # a fixture, imported for the change tests


def ask(quantum: Quantum, question: str, *, priority: str = "normal", **fields: Any) -> Reaching:
    return Reaching.objects.create(
        quantum=quantum,
        question=question,
        assumption="use the default",
        priority=priority,
        deadline=timezone.now() + timedelta(hours=1),
        **fields,
    )


def test_it_lists_pending_questions_in_queue_order_and_pages_them(reader: ApiClient) -> None:
    quantum = make_quantum("Ask")
    normal = ask(quantum, "Which colour?")
    critical = ask(quantum, "Drop the table?", priority="critical")
    ask(quantum, "Old one", status="answered", answer="yes")
    body = reader.get("/api/questions").json()
    assert [q["id"] for q in body["items"]] == [critical.pk, normal.pk]
    first = reader.get("/api/questions", {"limit": 1}).json()
    second = reader.get("/api/questions", {"limit": 1, "cursor": first["next_cursor"]}).json()
    assert [q["id"] for q in first["items"] + second["items"]] == [critical.pk, normal.pk]
    answered = reader.get("/api/questions", {"status": "answered"}).json()
    assert [q["question"] for q in answered["items"]] == ["Old one"]


def test_it_answers_a_question_once(operator: ApiClient) -> None:
    quantum = make_quantum("Quarantined", labels=[])
    reaching = ask(quantum, "What now?")
    body = operator.post(f"/api/questions/{reaching.pk}/answer", {"text": "leave it"}).json()
    assert (body["kind"], body["reaching_id"]) == ("quarantine", reaching.pk)
    reaching.refresh_from_db()
    assert (reaching.status, reaching.answer, reaching.answered_by) == (
        "answered",
        "leave it",
        "api:ci",
    )
    again = operator.post(f"/api/questions/{reaching.pk}/answer", {"text": "again"})
    assert_problem(again, 409, "conflict")
    assert_problem(operator.post("/api/questions/999999/answer", {"text": "x"}), 404, "not-found")
    other = ask(quantum, "Empty?")
    assert_problem(operator.post(f"/api/questions/{other.pk}/answer", {"text": " "}),
                   422, "validation")  # fmt: skip
    other.refresh_from_db()
    assert other.status == "pending"


def test_it_grounds_and_rejects_drifts(operator: ApiClient) -> None:
    quantum = make_quantum("Drifted")
    grounded = Drift.objects.create(quantum=quantum, assumption="tabs")
    rejected = Drift.objects.create(quantum=quantum, assumption="spaces")
    listed = operator.get("/api/drifts", {"status": "open"}).json()
    assert [d["id"] for d in listed["items"]] == [rejected.pk, grounded.pk]
    body = operator.post(f"/api/drifts/{grounded.pk}/ground", {"comment": "fine"}).json()
    assert (body["status"], body["decided_by"]) == ("grounded", "api:ci")
    assert_problem(operator.post(f"/api/drifts/{grounded.pk}/ground"), 409, "conflict")
    assert_problem(operator.post(f"/api/drifts/{rejected.pk}/reject", {"reason": ""}),
                   422, "validation")  # fmt: skip
    body = operator.post(f"/api/drifts/{rejected.pk}/reject", {"reason": "we use tabs"}).json()
    assert body["status"] == "rejected" and body["correction_id"] is not None
    assert Quantum.objects.filter(pk=body["correction_id"]).exists()
    assert_problem(operator.post("/api/drifts/999999/ground"), 404, "not-found")


def test_it_shows_approves_and_rejects_changes(
    operator: ApiClient, repo: Path, tether_settings: Any
) -> None:
    approved = change_review_create(
        quantum_run_id=finished_run(make_quantum("A"), {"a.py": "print('a')\n"}).pk
    )
    b = make_quantum("B")
    rejected = change_review_create(quantum_run_id=finished_run(b, {"b.py": "print('b')\n"}).pk)
    Quantum.objects.filter(pk=b.pk).update(status="closed")  # as its finished run left it
    assert approved is not None and rejected is not None
    listed = operator.get("/api/changes", {"status": "pending"}).json()
    assert [c["id"] for c in listed["items"]] == [rejected.pk, approved.pk]
    assert "diff" not in listed["items"][0]
    shown = operator.get(f"/api/changes/{approved.pk}").json()
    assert shown["change"]["risk"] == "low"
    assert shown["files"][0]["path"] == "a.py"
    assert shown["files"][0]["diff"].startswith("diff --git a/a.py b/a.py")
    body = operator.post(f"/api/changes/{approved.pk}/approve").json()
    assert (body["status"], body["decided_by"]) == ("queued", "api:ci")
    assert_problem(operator.post(f"/api/changes/{approved.pk}/approve"), 409, "conflict")
    assert_problem(operator.post(f"/api/changes/{rejected.pk}/reject", {"reason": " "}),
                   422, "validation")  # fmt: skip
    assert ChangeReview.objects.get(pk=rejected.pk).status == "pending"
    body = operator.post(f"/api/changes/{rejected.pk}/reject", {"reason": "not this"}).json()
    assert body["status"] == "rejected"
    assert Quantum.objects.get(pk=b.pk).status == "open"  # reopened with the reason
    assert_problem(operator.get("/api/changes/999999"), 404, "not-found")
