"""The Goals pages, the autopilot card and the history page: what operators and viewers see,
creating a goal with errors and without, approve / abandon, pause / resume / force, 403 for
viewers, CSRF, and the live fragments the socket sends."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from autopilot.models import (
    Finding,
    Goal,
    GoalSource,
    GoalStatus,
    GoalTransition,
    Hub,
    HubTransition,
    Spend,
)
from autopilot.services.goals.lifecycle import goal_approve, goal_create
from autopilot.services.goals.planning import PLANNER_ROLE
from autopilot.services.hub import hub_pause, hub_resume
from bursts.models import Burst, QuantumRun, Wave
from core.access import operator_ensure, viewer_ensure
from core.events import event_message, publish
from core.live import fragment_render
from quanta.models import Quantum
from quanta.services import quantum_close, quantum_create
from tether.models import ChangeReview

pytestmark = pytest.mark.django_db


@pytest.fixture
def op_client(client: Client) -> Client:
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    return client


@pytest.fixture
def viewer_client(client: Client) -> Client:
    client.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    return client


def a_goal(title: str = "Faster ready query", **fields: Any) -> Goal:
    return goal_create(title=title, success_criteria="p95 under 5 ms", by="op", **fields)


def text(response: Any) -> str:
    return str(response.content.decode())


VALID = {
    "title": "Dark mode",
    "description": "the whole UI",
    "success_criteria": "every page has a dark theme",
    "verify_commands": "pytest -q\n\n  ruff check .  \n",
    "priority": "1",
    "labels": "ui, theme",
    "budget_usd": "12.50",
}


# --- the Goals page ---------------------------------------------------------------------------


def test_it_lists_goals_by_status_with_proposed_ones_waiting(op_client: Client) -> None:
    mine = a_goal("Operator's goal")
    idea = a_goal("Contemplated idea", source=GoalSource.CONTEMPLATION)
    approved = a_goal("Approved goal", priority=0)
    goal_approve(goal_id=approved.pk, by="op")

    page = text(op_client.get("/goals/"))

    # Proposed first (waiting for approval), then approved.
    assert page.index("goals-proposed") < page.index("goals-approved")
    row = page[page.index(f'id="goal-row-{idea.pk}"') :]
    row = row[: row.index("</tr>")]
    assert "waiting for approval" in row and "contemplation" in row
    assert f'id="goal-approve-{mine.pk}"' in page
    assert f'id="goal-approve-{approved.pk}"' not in page  # approved already
    assert f'id="goal-abandon-{approved.pk}"' in page
    assert "not planned" in page  # no quanta yet
    only = text(op_client.get("/goals/?status=approved"))
    assert "Approved goal" in only and "Operator&#x27;s goal" not in only


def test_it_shows_progress_and_spend(op_client: Client) -> None:
    goal = a_goal(budget_usd=Decimal(5))
    epic = quantum_create(title="epic", kind="epic")
    Goal.objects.filter(pk=goal.pk).update(epic=epic, status=GoalStatus.ACTIVE)
    first = quantum_create(title="one", parent_id=epic.pk)
    quantum_create(title="two", parent_id=epic.pk, depends_on=[first.pk])
    quantum_close(quantum_id=first.pk, reason="done")
    Spend.objects.create(day=timezone.localdate(), scope="executing", goal=goal, usd="1.25")

    row = text(op_client.get("/goals/"))
    row = row[row.index(f'id="goal-row-{goal.pk}"') :]
    row = row[: row.index("</tr>")]

    assert "1/2" in row and '<progress max="2" value="1">' in row
    assert "$1.25" in row and "of $5.00" in row


def test_it_creates_a_goal_from_the_form(op_client: Client) -> None:
    response = op_client.post("/goals/new/", VALID)

    goal = Goal.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/goals/{goal.pk}/"
    assert (goal.status, goal.title, goal.priority) == (GoalStatus.PROPOSED, "Dark mode", 1)
    assert goal.verify_commands == ["pytest -q", "ruff check ."]
    assert goal.labels == ["ui", "theme"]
    assert goal.budget_usd == Decimal("12.5")
    assert goal.created_by == "op" and goal.source == GoalSource.OPERATOR
    page = text(op_client.get(response["Location"]))
    assert f"Goal #{goal.pk} proposed" in page
    assert 'id="goal-waiting"' in page


def test_it_shows_field_errors_and_keeps_what_was_typed(op_client: Client) -> None:
    response = op_client.post(
        "/goals/new/", {**VALID, "success_criteria": "", "priority": "9", "budget_usd": "-1"}
    )

    assert response.status_code == 400
    page = text(response)
    assert "Say what must be true when the goal is done." in page
    assert re.search(r'id="field-priority".*?errorlist', page, re.S)
    assert re.search(r'id="field-budget_usd".*?errorlist', page, re.S)
    assert 'value="Dark mode"' in page and "ruff check ." in page and 'value="ui, theme"' in page
    assert not Goal.objects.exists()


def test_it_names_a_verify_command_the_guard_refuses(op_client: Client) -> None:
    response = op_client.post("/goals/new/", {**VALID, "verify_commands": "pytest -q\nrm -rf /"})

    assert response.status_code == 400
    field = text(response)
    field = field[field.index('id="field-verify_commands"') :]
    assert "&#x27;rm -rf /&#x27; is refused by the command guard" in field[: field.index("</div>")]
    assert not Goal.objects.exists()


def test_it_puts_a_service_refusal_next_to_its_field(op_client: Client) -> None:
    # The form lets any label through; the service refuses the reserved ones, naming the field.
    response = op_client.post("/goals/new/", {**VALID, "labels": "autopilot"})

    assert response.status_code == 400
    field = text(response)
    field = field[field.index('id="field-labels"') :]
    assert "errorlist" in field[: field.index("</div>")]
    assert not Goal.objects.exists()


def test_it_approves_and_abandons(op_client: Client) -> None:
    goal, other = a_goal(), a_goal("Other")

    response = op_client.post(f"/goals/{goal.pk}/approve/", {"next": "/goals/"})
    assert response["Location"] == "/goals/"
    goal.refresh_from_db()
    assert (goal.status, goal.approved_by) == (GoalStatus.APPROVED, "op")
    again = op_client.post(f"/goals/{goal.pk}/approve/", follow=True)
    assert "cannot move goal" in text(again)  # stale: said, nothing changed

    op_client.post(f"/goals/{other.pk}/abandon/", {"reason": "not worth it"})
    other.refresh_from_db()
    assert (other.status, other.reason) == (GoalStatus.ABANDONED, "not worth it")
    assert op_client.post("/goals/999999/approve/").status_code == 404


def test_it_refuses_an_outside_next(op_client: Client) -> None:
    goal = a_goal()
    response = op_client.post(f"/goals/{goal.pk}/approve/", {"next": "https://evil.example/"})
    assert response["Location"] == f"/goals/{goal.pk}/"


def test_viewers_see_but_cannot_act(viewer_client: Client) -> None:
    goal = a_goal()

    page = text(viewer_client.get("/goals/"))
    assert "Faster ready query" in page
    assert 'id="goal-form"' not in page and f'id="goal-approve-{goal.pk}"' not in page
    assert 'id="autopilot-pause"' not in text(viewer_client.get("/"))
    for url in (
        "/goals/new/",
        f"/goals/{goal.pk}/approve/",
        f"/goals/{goal.pk}/abandon/",
        "/autopilot/pause/",
        "/autopilot/resume/",
        "/autopilot/force/",
    ):
        assert viewer_client.post(url, {**VALID, "state": "improving"}).status_code == 403
    goal.refresh_from_db()
    assert goal.status == GoalStatus.PROPOSED
    assert Goal.objects.count() == 1


def test_actions_need_the_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    goal = a_goal()

    assert client.post("/goals/new/", VALID).status_code == 403
    assert client.post(f"/goals/{goal.pk}/approve/").status_code == 403
    assert client.post("/autopilot/pause/").status_code == 403
    page = text(client.get("/goals/"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    ok = client.post(f"/goals/{goal.pk}/approve/", {"csrfmiddlewaretoken": token.group(1)})
    assert ok.status_code == 302


def test_only_logged_in_users_see_the_pages(client: Client) -> None:
    for url in ("/goals/", "/autopilot/"):
        assert client.get(url)["Location"].startswith("/login/")


# --- a goal's page ----------------------------------------------------------------------------


def test_the_goal_page_shows_history_decomposition_runs_and_verification(
    op_client: Client,
) -> None:
    from psychonauts.runtime.runs import agent_run_create

    goal = a_goal(verify_commands=["pytest -q"])
    goal_approve(goal_id=goal.pk, by="op")
    epic = quantum_create(title="epic", kind="epic")
    Goal.objects.filter(pk=goal.pk).update(epic=epic, status=GoalStatus.FAILED)
    GoalTransition.objects.create(
        goal=goal, from_status="verifying", to_status="failed", reason="1 of 1 command(s) failed"
    )
    first = quantum_create(title="Index the column", parent_id=epic.pk)
    second = quantum_create(title="Use the index", parent_id=epic.pk, depends_on=[first.pk])
    run = agent_run_create(quantum_id=epic.pk, role=PLANNER_ROLE)
    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    quantum_run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=first, pipeline_name="default"
    )
    change = ChangeReview.objects.create(
        quantum_run=quantum_run, quantum=first, branch="q", base="main", head_sha="a" * 40
    )

    page = text(op_client.get(f"/goals/{goal.pk}/"))

    assert 'id="goal-status">failed' in page
    assert "approved by op" in page  # the history
    child = page[page.index(f'id="goal-child-{second.pk}"') :]
    assert f'href="/quanta/{first.pk}/">#{first.pk}</a>' in child[: child.index("</tr>")]
    child = page[page.index(f'id="goal-child-{first.pk}"') :]
    assert f'href="/grounding/changes/{change.pk}/"' in child[: child.index("</tr>")]
    assert "Index the column" in page
    assert f'href="/agents/{run.pk}/"' in page
    assert "<code>pytest -q</code>" in page
    assert "1 of 1 command(s) failed" in page
    assert 'id="goal-approve"' in page  # a failed goal may be approved again
    assert op_client.get("/goals/999999/").status_code == 404


# --- the autopilot card and history -----------------------------------------------------------


def test_the_dashboard_card_shows_a_fresh_autopilot(op_client: Client) -> None:
    page = text(op_client.get("/"))

    assert 'id="autopilot-state">resting' in page
    assert 'id="autopilot-paused"' in page
    assert 'id="autopilot-resume"' in page and 'id="autopilot-pause"' not in page
    assert "spend cap reached" not in page
    for scope in ("executing", "improving", "contemplating", "healing", "operator"):
        assert f'data-scope="{scope}"' in page


def test_pause_resume_and_force_from_the_card(op_client: Client) -> None:
    response = op_client.post("/autopilot/resume/")
    assert response["Location"] == "/"
    assert Hub.objects.get().paused is False
    page = text(op_client.get("/"))
    assert 'id="autopilot-pause"' in page and 'id="autopilot-paused"' not in page

    op_client.post("/autopilot/force/", {"state": "improving", "next": "/autopilot/"})
    hub = Hub.objects.get()
    assert (hub.state, hub.forced) == ("improving", True)
    assert 'id="autopilot-forced"' in text(op_client.get("/"))

    op_client.post("/autopilot/pause/", {"reason": "lunch"})
    hub.refresh_from_db()
    assert hub.paused and "lunch" in hub.paused_reason
    refused = op_client.post("/autopilot/force/", {"state": "dreaming"}, follow=True)
    assert "Select a valid choice" in text(refused)
    assert Hub.objects.get().state == "improving"


def test_the_card_says_when_the_spend_cap_is_reached(op_client: Client, settings: Any) -> None:
    settings.SPEND_CAP_DAY_USD = 1.0
    Spend.objects.create(day=timezone.localdate(), scope="operator", usd="1.5")
    Spend.objects.create(day=timezone.localdate(), scope="improving", usd="3.5")

    page = text(op_client.get("/"))

    assert "spend cap reached: agents paused" in page
    improving = page[page.index('data-scope="improving"') :]
    assert "$3.50" in improving[: improving.index("</tr>")]
    assert 'class="over"' in improving[: improving.index("</tr>")]  # its budget is spent


def test_the_history_page(op_client: Client) -> None:
    hub_resume(by="op")
    hub_pause(by="op", reason="enough")
    Spend.objects.create(day=timezone.localdate(), scope="executing", usd="2")
    Spend.objects.create(day=timezone.localdate() - timedelta(days=3), scope="improving", usd="0.5")
    quantum = quantum_create(title="Fix the TODO")
    Finding.objects.create(
        scanner="todo", path="app.py", line=3, message="TODO: fix", fingerprint="a",
        quantum=quantum, last_seen=timezone.now(), filed_at=timezone.now(),
    )  # fmt: skip
    Finding.objects.create(
        scanner="lint", path="app.py", line=9, message="E501", fingerprint="b",
        last_seen=timezone.now(), skipped="filed 2 hours ago",
    )  # fmt: skip

    page = text(op_client.get("/autopilot/"))

    assert 'id="autopilot-card"' in page
    transitions = page[page.index('id="hub-transitions"') :]
    transitions = transitions[: transitions.index("</table>")]
    assert transitions.count("<tr><td") >= 2 and "enough" in transitions
    today = timezone.localdate().strftime("%Y-%m-%d")
    row = page[page.index(f'data-day="{today}"') :]
    assert "$2.0000" in row[: row.index("</tr>")]
    assert page.count("data-day=") == 14
    assert f'href="/quanta/{quantum.pk}/"' in page and "filed 2 hours ago" in page
    assert "No agent is waiting for a budget." in page


def test_the_history_pages_through_transitions(op_client: Client, settings: Any) -> None:
    settings.UI_PAGE_SIZE = 2
    for n in range(5):
        HubTransition.objects.create(from_state="", to_state="resting", reason=f"r{n}", by="tick")

    def table(url: str) -> str:
        page = text(op_client.get(url))
        return page[page.index('id="hub-transitions"') : page.index('id="spend-per-day"')]

    first = table("/autopilot/")
    assert "r4" in first and "r3" in first and "r2" not in first and 'id="next-page"' in first
    assert "r0" in table("/autopilot/?page=3") and "r1" not in table("/autopilot/?page=3")


# --- live fragments ---------------------------------------------------------------------------


def test_live_fragments_redraw_the_card_and_the_goals() -> None:
    goal = a_goal()
    hub_resume(by="op")
    hub_event = event_message(publish("autopilot:hub", "hub_transition", {"to_state": "resting"}))
    goal_event = event_message(
        publish("autopilot:goal", "goal_status_changed", {"goal_id": goal.pk})
    )

    dashboard = fragment_render(hub_event, page="dashboard", params={}, can_operate=True)
    assert 'id="autopilot-card" data-swap="replace"' in dashboard
    assert 'id="autopilot-pause"' in dashboard  # resumed: the fragment has the new controls
    viewer = fragment_render(hub_event, page="dashboard", params={}, can_operate=False)
    assert 'id="autopilot-pause"' not in viewer

    history = fragment_render(hub_event, page="autopilot", params={"number": "1"}, can_operate=True)
    assert 'id="hub-transitions" data-swap="replace"' in history and "resumed by op" in history
    older = fragment_render(hub_event, page="autopilot", params={"number": "2"}, can_operate=True)
    assert "autopilot-card" in older and "hub-transitions" not in older

    goals = fragment_render(goal_event, page="goals", params={"status": ""}, can_operate=True)
    assert 'id="goal-list" data-swap="replace"' in goals and f"goal-row-{goal.pk}" in goals
    mine = fragment_render(
        goal_event, page="goal", params={"goal_id": str(goal.pk)}, can_operate=True
    )
    assert 'id="goal-body" data-swap="replace"' in mine
    other = fragment_render(goal_event, page="goal", params={"goal_id": "999"}, can_operate=True)
    assert other == ""


def test_live_fragments_follow_a_goals_quanta() -> None:
    goal = a_goal()
    epic = quantum_create(title="epic", kind="epic")
    Goal.objects.filter(pk=goal.pk).update(epic=epic)
    child = quantum_create(title="child", parent_id=epic.pk)
    stranger = Quantum.objects.exclude(pk__in=[epic.pk, child.pk]).first() or quantum_create(
        title="stranger"
    )
    params = {"goal_id": str(goal.pk)}

    mine = event_message(publish("quanta", "quantum_updated", {"quantum_id": child.pk}))
    theirs = event_message(publish("quanta", "quantum_updated", {"quantum_id": stranger.pk}))

    assert "goal-body" in fragment_render(mine, page="goal", params=params, can_operate=False)
    assert fragment_render(theirs, page="goal", params=params, can_operate=False) == ""
    assert "goal-list" in fragment_render(mine, page="goals", params={}, can_operate=False)
    assert fragment_render(theirs, page="goals", params={}, can_operate=False) == ""


def test_it_survives_hostile_input(op_client: Client) -> None:
    huge = 10**20
    assert op_client.get(f"/goals/{huge}/").status_code == 404
    assert op_client.post(f"/goals/{huge}/approve/").status_code == 404
    assert op_client.post(f"/goals/{huge}/abandon/").status_code == 404
    assert op_client.get("/goals/?status=nonsense").status_code == 200
    assert op_client.get("/autopilot/?page=nonsense").status_code == 200
    for bad in ({"title": "a\x00b"}, {"budget_usd": "1e400"}, {"priority": "1.5"},
                {"verify_commands": "x" * 3000}, {"labels": "bad label!"}):  # fmt: skip
        response = op_client.post("/goals/new/", {**VALID, **bad})
        assert response.status_code == 400, bad
    assert not Goal.objects.exists()
    assert op_client.post("/autopilot/pause/", {"reason": "x" * 2000}).status_code == 302
    assert Hub.objects.filter(paused=True, paused_reason__startswith="xx").count() == 0


def test_the_pages_read_in_a_fixed_number_of_queries(op_client: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def goals_with_quanta(n: int) -> Goal:
        goal = a_goal()
        for i in range(n):
            epic = quantum_create(title=f"epic {i}", kind="epic")
            other = a_goal(f"goal {i}")
            Goal.objects.filter(pk=other.pk).update(epic=epic)
            quantum_create(title="child", parent_id=epic.pk)
        epic = quantum_create(title="epic", kind="epic")
        Goal.objects.filter(pk=goal.pk).update(epic=epic)
        for i in range(n):
            quantum_create(title=f"child {i}", parent_id=epic.pk)
        return goal

    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert op_client.get(url).status_code == 200
        return len(queries)

    few = goals_with_quanta(1)
    HubTransition.objects.create(to_state="resting", reason="first", by="tick")
    counts = [count("/goals/"), count(f"/goals/{few.pk}/"), count("/autopilot/")]
    many = goals_with_quanta(6)
    for i in range(6):
        HubTransition.objects.create(to_state="resting", reason=f"r{i}", by="tick")
    assert [count("/goals/"), count(f"/goals/{many.pk}/"), count("/autopilot/")] == counts


def test_resuming_is_refused_while_the_cap_is_reached(op_client: Client, settings: Any) -> None:
    settings.SPEND_CAP_DAY_USD = 1.0
    Spend.objects.create(day=timezone.localdate(), scope="operator", usd="2")

    page = text(op_client.post("/autopilot/resume/", follow=True))

    assert "spend cap reached: agents paused" in page
    error = page[page.index('class="error"') :]
    assert "SPEND_CAP_DAY_USD" in error[: error.index("</li>")]
    assert Hub.objects.get().paused is True
