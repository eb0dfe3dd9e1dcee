"""The Tether and Grounding pages: what operators and viewers see, every action and its errors,
stale actions, 403/404, and the live fragments through the real ASGI application."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse
from django.utils import timezone

from psychonauts.workspaces.git import git
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.models import Quantum
from tests.bursts.conftest import pipeline
from tests.tether.conftest import (
    SOLO_WITH_TESTER,
    make_quantum,
    make_run,
    scripts,
    tether_settings,
)
from tests.tether.test_changes import finished_run, main_file
from tether.models import (
    ChangeReview,
    ChangeStatus,
    Drift,
    DriftStatus,
    MutationStatus,
    PipelineMutation,
    Reaching,
    ReachingStatus,
)
from tether.services import (
    change_reject,
    change_review_create,
    drift_reject,
    mutation_propose,
    reaching_answer,
    reaching_ask,
    reaching_expire,
)
from tether.services.merge_queue import merge_queue_run

__all__ = ["make_quantum", "make_run", "scripts", "tether_settings"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def ask(make_run: Any, redis_client: Any, django_capture_on_commit_callbacks: Any) -> Any:
    """A pending reaching of a fresh agent run (queued in Redis as after a real commit)."""

    def make(
        question: str = "Keep the old API?",
        *,
        priority: str = "normal",
        timeout_s: float = 300,
        assumption: str = "keep the old API",
    ) -> Reaching:
        run = make_run("coder")
        with django_capture_on_commit_callbacks(execute=True):
            return reaching_ask(
                agent_run_id=run.pk,
                quantum_id=run.quantum_id,
                tool_use_id="toolu_1",
                question=question,
                assumption=assumption,
                priority=priority,
                timeout_s=timeout_s,
            )

    return make


@pytest.fixture
def drift(ask: Any) -> Drift:
    """An open drift: a reaching whose deadline passed with nobody answering."""
    reaching = ask("Dates in UTC?", assumption="store dates in UTC", timeout_s=1)
    assert reaching_expire(reaching_id=reaching.pk, now=timezone.now() + timedelta(seconds=5))
    return Drift.objects.get(reaching=reaching)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- the Tether page ------------------------------------------------------------------------------


def test_it_lists_pending_reachings_in_queue_order_with_deadlines(viewer_client, ask, drift):
    low = ask("Low one?", priority="low")
    critical = ask("Critical one?", priority="critical")
    normal = ask("Normal one?", priority="normal", timeout_s=60)

    response = viewer_client.get(reverse("tether"))

    assert response.status_code == 200
    rows = [row["r"].pk for row in response.context["reachings"]]
    assert rows == [critical.pk, normal.pk, low.pk]
    orders = [row["order"] for row in response.context["reachings"]]
    assert orders == sorted(orders)  # the CSS order keeps live-appended cards in queue order
    html = response.content.decode()
    assert html.index("Critical one?") < html.index("Normal one?") < html.index("Low one?")
    assert f'data-deadline="{critical.deadline.isoformat()}"' in html
    assert f'id="drift-{drift.pk}"' in html and "store dates in UTC" in html
    assert 'id="count-reachings">3<' in html and 'id="count-drifts">1<' in html
    # A viewer sees no action form at all.
    for needle in [
        "answer-form",
        'id="ground-',
        'id="reject-',
        'id="note-',
        'id="late-',
        '<form method="post" action="/tether',
    ]:
        assert needle not in html, needle


def test_the_pages_read_in_a_fixed_number_of_queries(
    op_client, ask, drift, django_assert_max_num_queries
):
    for n in range(5):
        ask(f"Question {n}?")
        a_drift = ask(f"Drifting {n}?", timeout_s=1)
        reaching_expire(reaching_id=a_drift.pk, now=timezone.now() + timedelta(seconds=5))
    with django_assert_max_num_queries(12):
        response = op_client.get(reverse("tether"))
    assert len(response.context["reachings"]) == 5 and len(response.context["drifts"]) == 6
    with django_assert_max_num_queries(12):
        assert op_client.get(reverse("grounding")).status_code == 200


def test_an_operator_sees_the_forms(op_client, ask, drift):
    reaching = ask()
    html = op_client.get(reverse("tether")).content.decode()
    assert f'id="answer-form-{reaching.pk}"' in html
    for needle in [f"ground-{drift.pk}", f"reject-{drift.pk}", f"note-{drift.pk}"]:
        assert needle in html
    assert f'id="late-{drift.pk}"' in html  # its reaching timed out: a late answer is possible


def test_it_answers_a_reaching_in_place(op_client, ask):
    reaching = ask()

    response = op_client.post(
        reverse("reaching_answer", args=[reaching.pk]), {"text": "drop it"}, follow=True
    )

    assert response.redirect_chain[-1][0] == reverse("tether")
    assert f"Answered reaching #{reaching.pk}" in messages_of(response)[0]
    reaching.refresh_from_db()
    assert (reaching.status, reaching.answer, reaching.answered_by) == ("answered", "drop it", "op")
    assert f'id="answer-form-{reaching.pk}"' not in response.content.decode()


def test_an_empty_answer_is_an_error_next_to_the_field(op_client, ask):
    reaching = ask()
    other = ask("Another?")

    response = op_client.post(reverse("reaching_answer", args=[reaching.pk]), {"text": "   "})

    assert response.status_code == 400
    rows = {row["r"].pk: row["form"] for row in response.context["reachings"]}
    assert rows[reaching.pk].errors == {"text": ["Write an answer."]}
    assert not rows[other.pk].is_bound
    assert "Write an answer." in response.content.decode()
    reaching.refresh_from_db()
    assert reaching.status == ReachingStatus.PENDING


@pytest.mark.parametrize("status", [ReachingStatus.ANSWERED, ReachingStatus.CANCELLED])
def test_a_stale_answer_says_so_and_changes_nothing(op_client, ask, status):
    reaching = ask()
    Reaching.objects.filter(pk=reaching.pk).update(status=status, answer="first")

    response = op_client.post(
        reverse("reaching_answer", args=[reaching.pk]), {"text": "second"}, follow=True
    )

    assert messages_of(response) == [f"reaching #{reaching.pk} is {status}; nothing changed"]
    reaching.refresh_from_db()
    assert (reaching.status, reaching.answer) == (status, "first")


def test_a_late_answer_supersedes_the_drift_and_says_so(op_client, drift):
    url = reverse("reaching_answer", args=[drift.reaching_id])

    response = op_client.post(url, {"text": "no: local time"}, follow=True)

    drift.refresh_from_db()
    assert drift.status == DriftStatus.SUPERSEDED and drift.correction_id
    (message,) = messages_of(response)
    assert "had already timed out" in message
    assert f"supersedes drift #{drift.pk}" in message
    assert f"correction quantum #{drift.correction_id}" in message
    html = response.content.decode()
    assert "Late answer" in html and "no: local time" in html
    assert f'id="drift-{drift.pk}-correction"' in html
    again = op_client.post(url, {"text": "yes after all"}, follow=True)
    assert "already has a late answer" in messages_of(again)[0]
    drift.refresh_from_db()
    assert drift.status == DriftStatus.SUPERSEDED


def test_a_late_answer_that_agrees_grounds_the_drift(op_client, drift):
    response = op_client.post(
        reverse("reaching_answer", args=[drift.reaching_id]), {"text": "yes"}, follow=True
    )
    assert f"drift #{drift.pk} is grounded" in messages_of(response)[0]
    drift.refresh_from_db()
    assert drift.status == DriftStatus.GROUNDED and drift.correction_id is None


def test_it_grounds_a_drift(op_client, drift):
    response = op_client.post(
        reverse("drift_ground", args=[drift.pk]), {"comment": "fine"}, follow=True
    )
    assert messages_of(response) == [f"Drift #{drift.pk} grounded: the assumption stands."]
    drift.refresh_from_db()
    assert (drift.status, drift.comment, drift.decided_by) == ("grounded", "fine", "op")


def test_it_rejects_a_drift_with_a_reason_and_files_a_correction(op_client, drift):
    url = reverse("drift_reject", args=[drift.pk])
    missing = op_client.post(url, {"reason": ""})
    assert missing.status_code == 400
    forms = {row["d"].pk: row["reject"] for row in missing.context["drifts"]}
    assert forms[drift.pk].errors == {"reason": ["Say why the assumption is wrong."]}
    assert Drift.objects.get(pk=drift.pk).status == DriftStatus.OPEN

    response = op_client.post(url, {"reason": "dates are local"}, follow=True)

    drift.refresh_from_db()
    assert drift.status == DriftStatus.REJECTED
    correction = Quantum.objects.get(pk=drift.correction_id)
    assert correction.kind == "correction" and "dates are local" in correction.body
    assert messages_of(response) == [
        f"Drift #{drift.pk} rejected; correction quantum #{correction.pk} filed."
    ]
    assert f'href="/quanta/{correction.pk}/"' in response.content.decode()


def test_it_notes_a_drift_and_the_note_needs_text(op_client, drift):
    url = reverse("drift_note", args=[drift.pk])
    missing = op_client.post(url, {"text": " "})
    assert missing.status_code == 400 and "Write the note." in missing.content.decode()
    response = op_client.post(url, {"text": "watch it"}, follow=True)
    assert messages_of(response) == [f"Note added to drift #{drift.pk}; it stays open."]
    noted = Drift.objects.get(pk=drift.pk)
    assert noted.status == DriftStatus.OPEN and noted.notes[0]["text"] == "watch it"


def test_deciding_a_drift_twice_says_so_and_changes_nothing(op_client, drift):
    op_client.post(reverse("drift_ground", args=[drift.pk]), {"comment": "first"}, follow=True)
    response = op_client.post(
        reverse("drift_reject", args=[drift.pk]), {"reason": "too late"}, follow=True
    )
    assert messages_of(response) == [f"drift #{drift.pk} is already grounded; nothing changed"]
    drift.refresh_from_db()
    assert (drift.status, drift.comment, drift.correction_id) == ("grounded", "first", None)
    assert not Quantum.objects.filter(kind="correction").exists()


# --- the Grounding page ---------------------------------------------------------------------------


@pytest.fixture
def change(repo, make_quantum, tether_settings) -> ChangeReview:
    quantum = make_quantum("Greet the world")
    run = finished_run(quantum, {"hello.py": "print('hi')\n", "README.md": None})
    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None
    Quantum.objects.filter(pk=quantum.pk).update(status="closed")  # as its done run left it
    return review


def test_it_lists_changes_pending_first_with_risk_and_reasons(viewer_client, change):
    response = viewer_client.get(reverse("grounding"))
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="change-{change.pk}"' in html and "Greet the world" in html
    assert f"risk-{change.risk}" in html
    for reason in change.reasons:
        assert reason in html
    assert 'id="count-changes">1<' in html


def test_the_change_page_shows_a_readable_diff_per_file(viewer_client, change):
    response = viewer_client.get(reverse("change", args=[change.pk]))
    assert response.status_code == 200
    paths = [f["f"].path for f in response.context["files"]]
    assert sorted(paths) == ["README.md", "hello.py"]
    html = response.content.decode()
    assert '<div class="add">+print(&#x27;hi&#x27;)</div>' in html
    assert '<div class="del">-' in html  # the deleted README
    assert "change-actions" not in html  # a viewer


def test_an_operator_approves_a_change(op_client, change, repo):
    url = reverse("change_approve", args=[change.pk])
    response = op_client.post(url, follow=True)
    change.refresh_from_db()
    assert change.status == ChangeStatus.QUEUED
    assert messages_of(response) == [
        f"Change #{change.pk} is in the merge queue: merged into main and verified in turn; "
        "the base moves only if the checks pass."
    ]
    merge_queue_run()
    change.refresh_from_db()
    assert change.status == ChangeStatus.MERGED and change.merge_sha
    assert main_file(repo, "hello.py") == "print('hi')\n"
    again = op_client.post(url, follow=True)
    assert messages_of(again) == [f"change #{change.pk} is merged; nothing changed"]


def _review(make_quantum, title: str, files: dict[str, str | None]) -> ChangeReview:
    quantum = make_quantum(title)
    review = change_review_create(quantum_run_id=finished_run(quantum, files).pk)
    assert review is not None
    Quantum.objects.filter(pk=quantum.pk).update(status="closed")  # as its done run left it
    return review


@pytest.fixture
def three_changes(repo, make_quantum, tether_settings) -> list[ChangeReview]:
    """Two low-risk changes and a medium one (it deletes a file)."""
    return [
        _review(make_quantum, "Add a", {"a.py": "A = 1\n"}),
        _review(make_quantum, "Add b", {"b.py": "B = 2\n"}),
        _review(make_quantum, "Drop the readme", {"README.md": None}),
    ]


def _statuses(changes: list[ChangeReview]) -> list[str]:
    return [ChangeReview.objects.get(pk=c.pk).status for c in changes]


def test_the_grounding_page_offers_selection_and_all_low_risk(op_client, three_changes):
    html = op_client.get(reverse("grounding")).content.decode()
    assert 'id="bulk-approve"' in html and 'id="approve-low-risk"' in html
    for c in three_changes:
        assert f'id="select-change-{c.pk}"' in html


def test_a_viewer_sees_no_bulk_approval(viewer_client, three_changes):
    html = viewer_client.get(reverse("grounding")).content.decode()
    assert 'id="bulk-approve"' not in html and "select-change-" not in html


def test_an_operator_approves_every_low_risk_change_at_once(op_client, three_changes):
    low_a, low_b, medium = three_changes
    assert (low_a.risk, low_b.risk, medium.risk) == ("low", "low", "medium")

    response = op_client.post(reverse("changes_approve"), {"all_low_risk": "1"}, follow=True)

    assert _statuses(three_changes) == ["queued", "queued", "pending"]
    assert messages_of(response)[0].startswith(
        f"2 change(s) in the merge queue: #{low_a.pk}, #{low_b.pk}."
    )


def test_an_operator_approves_the_selected_changes_and_hears_each_refusal(op_client, three_changes):
    low_a, low_b, medium = three_changes
    change_reject(change_id=low_b.pk, reason="not now")

    response = op_client.post(
        reverse("changes_approve"),
        {"change": [str(low_a.pk), str(low_b.pk), str(medium.pk)]},
        follow=True,
    )

    assert _statuses(three_changes) == ["queued", "rejected", "queued"]
    said = messages_of(response)
    assert said[0].startswith(f"2 change(s) in the merge queue: #{low_a.pk}, #{medium.pk}.")
    assert said[1] == f"Change #{low_b.pk} refused: change #{low_b.pk} is rejected; nothing changed"
    nothing = op_client.post(reverse("changes_approve"), {}, follow=True)
    assert messages_of(nothing) == ["Select the changes to approve, or approve all low-risk ones."]


def test_a_viewer_cannot_approve_in_bulk(viewer_client, three_changes):
    response = viewer_client.post(reverse("changes_approve"), {"all_low_risk": "1"})
    assert response.status_code == 403
    assert _statuses(three_changes) == ["pending", "pending", "pending"]


def test_a_moved_branch_is_reported_and_nothing_is_merged(op_client, change, repo):
    tree = workspace_ensure(quantum_id=change.quantum_id)
    (tree / "hello.py").write_text("print('changed after the review')\n")
    workspace_commit(workspace=tree, quantum_id=change.quantum_id, agent_id="late", role="coder")
    head = git("rev-parse", "main", cwd=repo)

    response = op_client.post(reverse("change_approve", args=[change.pk]), follow=True)

    (message,) = messages_of(response)
    assert "moved since the review" in message and "nothing merged" in message
    assert git("rev-parse", "main", cwd=repo) == head
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.PENDING


def test_a_conflict_is_reported_with_its_correction(op_client, repo, make_quantum, tether_settings):
    first, second = make_quantum("first"), make_quantum("second")
    a = change_review_create(quantum_run_id=finished_run(first, {"calc.py": "A = 1\n"}).pk)
    b = change_review_create(quantum_run_id=finished_run(second, {"calc.py": "B = 2\n"}).pk)
    assert a is not None and b is not None
    op_client.post(reverse("change_approve", args=[a.pk]), follow=True)
    op_client.post(reverse("change_approve", args=[b.pk]), follow=True)

    merge_queue_run()

    b.refresh_from_db()
    assert b.status == ChangeStatus.CONFLICTED
    html = op_client.get(reverse("change", args=[b.pk])).content.decode()
    assert "conflicts: calc.py" in html
    assert reverse("quantum", args=[b.correction_id]) in html


def test_rejecting_a_change_needs_a_reason_and_reopens_the_quantum(op_client, change):
    url = reverse("change_reject", args=[change.pk])
    missing = op_client.post(url, {"reason": ""})
    assert missing.status_code == 400
    assert missing.context["reject"].errors == {"reason": ["Say why the change is rejected."]}
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.PENDING

    response = op_client.post(url, {"reason": "use the helper"}, follow=True)

    assert messages_of(response) == [
        f"Change #{change.pk} rejected; quantum #{change.quantum_id} reopened."
    ]
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.REJECTED
    stale = op_client.post(url, {"reason": "again"}, follow=True)
    assert messages_of(stale) == [f"change #{change.pk} is rejected; nothing changed"]


def test_rejecting_a_change_whose_quantum_moved_on_says_why(op_client, change):
    Quantum.objects.filter(pk=change.quantum_id).update(status="open")
    response = op_client.post(
        reverse("change_reject", args=[change.pk]), {"reason": "no"}, follow=True
    )
    assert "cannot reopen" in messages_of(response)[0]
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.PENDING


@pytest.fixture
def mutation(make_run) -> PipelineMutation:
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])
    run = make_run("coder")
    return mutation_propose(
        pipeline="solo",
        text=SOLO_WITH_TESTER,
        rationale="a tester should check",
        agent_run_id=run.pk,
        quantum_id=run.quantum_id,
        tool_use_id="toolu_p",
    )


def test_it_shows_a_mutation_beside_the_current_pipeline(viewer_client, mutation):
    response = viewer_client.get(reverse("grounding"))
    (row,) = response.context["mutations"]
    assert row["v"].current_version == 1 and "coder" in row["v"].current_yaml
    html = response.content.decode()
    assert f'id="mutation-{mutation.pk}"' in html and "a tester should check" in html
    assert f"mutation-approve-{mutation.pk}" not in html


def test_a_mutation_diff_marks_only_the_lines_that_change(viewer_client, mutation):
    """The proposal is written in the agent's style (flow lists); the pipeline as it is now in
    the loader's: only the added stage is a change."""
    response = viewer_client.get(reverse("grounding"))
    (row,) = response.context["mutations"]
    changed = [(line["tag"], line["text"]) for line in row["diff"]]
    assert [c for c in changed if c[0] in ("add", "del")] == [
        ("del", "-- name: s0"),  # the fixture's stage name; the proposal names it `implement`
        ("add", "+- name: implement"),
        ("add", "+- name: check"),
        ("add", "+  agents:"),
        ("add", "+  - tester"),
    ]
    assert ("ctx", "   agents:") in changed and ("ctx", "   - coder") in changed


def test_an_operator_approves_a_mutation(op_client, mutation):
    url = reverse("mutation_approve", args=[mutation.pk])
    response = op_client.post(url, follow=True)
    assert messages_of(response) == ["Pipeline solo is now at version 2."]
    assert PipelineMutation.objects.get(pk=mutation.pk).status == MutationStatus.APPROVED
    again = op_client.post(url, follow=True)
    assert messages_of(again) == [f"mutation #{mutation.pk} is approved; nothing changed"]


def test_an_operator_rejects_a_mutation(op_client, mutation):
    too_long = op_client.post(
        reverse("mutation_reject", args=[mutation.pk]), {"reason": "x" * 6000}
    )
    assert too_long.status_code == 400
    (row,) = too_long.context["mutations"]
    assert "at most 5000 characters" in row["reject"].errors["reason"][0]
    assert PipelineMutation.objects.get(pk=mutation.pk).status == MutationStatus.PENDING
    response = op_client.post(
        reverse("mutation_reject", args=[mutation.pk]), {"reason": "not now"}, follow=True
    )
    assert messages_of(response) == [f"Proposal #{mutation.pk} for solo rejected."]
    m = PipelineMutation.objects.get(pk=mutation.pk)
    assert (m.status, m.comment) == (MutationStatus.REJECTED, "not now")


# --- access -----------------------------------------------------------------------------------


def test_a_viewer_cannot_act(viewer_client, ask, drift, change, mutation):
    reaching = ask()
    posts = [
        (reverse("reaching_answer", args=[reaching.pk]), {"text": "x"}),
        (reverse("drift_ground", args=[drift.pk]), {}),
        (reverse("drift_reject", args=[drift.pk]), {"reason": "x"}),
        (reverse("drift_note", args=[drift.pk]), {"text": "x"}),
        (reverse("change_approve", args=[change.pk]), {}),
        (reverse("change_reject", args=[change.pk]), {"reason": "x"}),
        (reverse("mutation_approve", args=[mutation.pk]), {}),
        (reverse("mutation_reject", args=[mutation.pk]), {}),
    ]
    for url, data in posts:
        assert viewer_client.post(url, data).status_code == 403, url
    assert Reaching.objects.get(pk=reaching.pk).status == ReachingStatus.PENDING
    assert Drift.objects.get(pk=drift.pk).status == DriftStatus.OPEN
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.PENDING
    assert PipelineMutation.objects.get(pk=mutation.pk).status == MutationStatus.PENDING
    html = viewer_client.get(reverse("change", args=[change.pk])).content.decode()
    assert "change-approve" not in html


def test_actions_are_post_only(op_client, drift):
    assert op_client.get(reverse("drift_ground", args=[drift.pk])).status_code == 405


def test_unknown_ids_are_404(op_client):
    assert op_client.get(reverse("change", args=[999999])).status_code == 404
    posts = [
        reverse("reaching_answer", args=[999999]),
        reverse("drift_ground", args=[999999]),
        reverse("drift_reject", args=[999999]),
        reverse("drift_note", args=[999999]),
        reverse("change_approve", args=[999999]),
        reverse("change_reject", args=[999999]),
        reverse("mutation_approve", args=[999999]),
        reverse("mutation_reject", args=[999999]),
    ]
    for url in posts:
        assert op_client.post(url, {"text": "x", "reason": "x"}).status_code == 404, url


# --- elsewhere ------------------------------------------------------------------------------------


def test_the_quantum_page_shows_its_drifts_and_change_reviews(viewer_client, drift, change):
    html = viewer_client.get(reverse("quantum", args=[drift.quantum_id])).content.decode()
    assert "quantum-drifts" in html and "store dates in UTC" in html
    html = viewer_client.get(reverse("quantum", args=[change.quantum_id])).content.decode()
    assert f'href="/grounding/changes/{change.pk}/"' in html


def test_the_dashboard_counts_what_waits_for_the_tether(viewer_client, ask, drift):
    ask()
    html = viewer_client.get("/").content.decode()
    assert 'id="count-reachings">1<' in html
    assert 'id="count-drifts">1<' in html
    assert 'id="count-changes">0<' in html
    assert 'id="nav-tether"' in html and 'id="nav-grounding"' in html


def test_a_change_event_updates_its_row_on_the_grounding_page(change):
    from core.events import EventMessage, publish
    from core.live import fragment_render
    from tether.services.changes import change_payload

    ChangeReview.objects.filter(pk=change.pk).update(status=ChangeStatus.MERGED, decided_by="op")
    change.refresh_from_db()
    event = publish("tether:drifts", "change_merged", change_payload(change))
    message: EventMessage = {
        "id": event.pk,
        "topic": event.topic,
        "type": event.type,
        "payload": event.payload,
        "created_at": "",
        "session_id": None,
    }

    html = fragment_render(message, page="grounding", params={}, can_operate=False)

    assert f'<tr id="change-{change.pk}" data-swap="prepend:changes">' in html
    assert '<span class="pill s-merged">merged</span>' in html
    assert 'id="count-changes">0<' in html


# --- live, through the real ASGI application ------------------------------------------------------


def _asked(make_run: Any, question: str) -> Reaching:
    run = make_run("coder")
    return reaching_ask(
        agent_run_id=run.pk,
        quantum_id=run.quantum_id,
        tool_use_id="toolu_ws",
        question=question,
        assumption="keep it",
        timeout_s=300,
    )


async def _socket(user: Any, *, page: str = "tether") -> Any:
    from channels.testing import WebsocketCommunicator

    from annihilation.asgi import application
    from core.live import events_last_id

    communicator = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost")]
    )
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    after = await database_sync_to_async(events_last_id)()
    await communicator.send_json_to(
        {"subscribe": ["tether:reaching", "tether:drifts"], "after": after, "page": page}
    )
    return communicator


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_new_reaching_reaches_the_tether_page_and_leaves_it_when_answered(
    redis_client, make_run
):
    from core.access import operator_ensure, viewer_ensure

    operator = await database_sync_to_async(operator_ensure)(username="o", password="pw")
    viewer = await database_sync_to_async(viewer_ensure)(username="v", password="pw")
    op_socket, viewer_socket = await _socket(operator), await _socket(viewer)

    reaching = await database_sync_to_async(_asked)(make_run, "Which <b>way</b>?")

    pushed = await op_socket.receive_json_from(timeout=3)
    assert pushed["event"]["type"] == "question_asked"
    html = pushed["html"]
    assert f'id="reaching-{reaching.pk}" data-swap="append:reachings"' in html
    assert "Which &lt;b&gt;way&lt;/b&gt;?" in html  # escaped
    assert f'id="answer-form-{reaching.pk}"' in html and "data-deadline=" in html
    assert 'id="count-reachings">1<' in html
    seen_by_viewer = await viewer_socket.receive_json_from(timeout=3)
    assert f'id="reaching-{reaching.pk}"' in seen_by_viewer["html"]
    assert "answer-form" not in seen_by_viewer["html"]

    await database_sync_to_async(reaching_answer)(reaching_id=reaching.pk, text="that way")

    gone = await op_socket.receive_json_from(timeout=3)
    assert gone["event"]["type"] == "question_answered"
    assert f'<div id="reaching-{reaching.pk}" data-swap="replace" hidden></div>' in gone["html"]
    assert 'id="count-reachings">0<' in gone["html"]
    await op_socket.disconnect()
    await viewer_socket.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_drift_decision_updates_its_card_live(redis_client, make_run):
    from core.access import viewer_ensure

    viewer = await database_sync_to_async(viewer_ensure)(username="v", password="pw")
    reaching = await database_sync_to_async(_asked)(make_run, "Dates?")
    socket = await _socket(viewer)

    def expire() -> None:
        reaching_expire(reaching_id=reaching.pk, now=timezone.now() + timedelta(seconds=400))

    await database_sync_to_async(expire)()
    timed_out = await socket.receive_json_from(timeout=3)
    assert timed_out["event"]["type"] == "question_timed_out"
    created = await socket.receive_json_from(timeout=3)
    assert created["event"]["type"] == "drift_created"
    drift_id = created["event"]["payload"]["drift_id"]
    assert f'id="drift-{drift_id}" data-swap="prepend:drifts"' in created["html"]

    await database_sync_to_async(drift_reject)(drift_id=drift_id, reason="dates are local")

    rejected = await socket.receive_json_from(timeout=3)
    assert rejected["event"]["type"] == "drift_rejected"
    assert f'id="drift-{drift_id}-correction"' in rejected["html"]
    assert 'id="count-drifts">0<' in rejected["html"]
    await socket.disconnect()


async def _reply(socket: Any) -> Any:
    """The next action reply (the socket also carries the events the actions cause)."""
    while True:
        message = await socket.receive_json_from(timeout=3)
        if "action" in message:
            return message


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_socket_actions_are_for_operators_and_stale_ones_are_refused(redis_client, make_run):
    from core.access import operator_ensure, viewer_ensure

    viewer = await database_sync_to_async(viewer_ensure)(username="v", password="pw")
    operator = await database_sync_to_async(operator_ensure)(username="o", password="pw")
    reaching = await database_sync_to_async(_asked)(make_run, "Keep it?")
    answer = {"action": "reaching_answer", "reaching_id": reaching.pk, "text": "yes"}

    socket = await _socket(viewer)
    await socket.send_json_to(answer)
    assert await socket.receive_json_from(timeout=3) == {
        "action": "reaching_answer",
        "ok": False,
        "error": "forbidden",
    }
    await socket.disconnect()
    status = await database_sync_to_async(lambda: Reaching.objects.get(pk=reaching.pk).status)()
    assert status == ReachingStatus.PENDING

    socket = await _socket(operator, page="")
    await socket.send_json_to(answer)
    reply = await _reply(socket)
    assert reply["ok"] and reply["kind"] == "answered", reply
    await socket.send_json_to(answer)
    stale = await _reply(socket)
    assert stale == {
        "action": "reaching_answer",
        "ok": False,
        "error": f"reaching #{reaching.pk} is answered; nothing changed",
    }
    await socket.send_json_to({"action": "drift_reject", "drift_id": "1", "reason": "x"})
    bad = await _reply(socket)
    assert bad["error"] == "drift_id must be an integer", bad
    await socket.disconnect()
