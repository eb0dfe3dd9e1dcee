"""The autopilot's admin pages load, filter and search, and are read-only: no add, no change,
no delete (every change goes through the services)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from autopilot.models import BaseCheck, Finding, Goal, GoalTransition, Hub, HubTransition, Spend
from autopilot.services.goals.lifecycle import goal_approve, goal_create
from psychonauts.runtime.runs import agent_run_create
from quanta.services import quantum_create

pytestmark = pytest.mark.django_db

MODELS = (
    "goal", "goaltransition", "hub", "hubtransition", "spend", "hold", "finding", "basecheck",
)  # fmt: skip


@pytest.fixture
def rows(db: Any) -> dict[str, Any]:
    from autopilot.models import Hold

    goal = goal_create(title="Dark mode", success_criteria="dark", by="op")
    goal_approve(goal_id=goal.pk, by="op")
    quantum = quantum_create(title="q")
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    return {
        "goal": goal,
        "goaltransition": GoalTransition.objects.filter(goal=goal).first(),
        "hub": Hub.objects.get_or_create(pk=1)[0],
        "hubtransition": HubTransition.objects.create(to_state="resting", reason="idle", by="tick"),
        "spend": Spend.objects.create(day=timezone.localdate(), scope="executing", goal=goal),
        "hold": Hold.objects.create(agent_run=run, scope="cap", reason="cap reached"),
        "finding": Finding.objects.create(
            scanner="todo", path="a.py", message="TODO", fingerprint="f", last_seen=timezone.now()
        ),
        "basecheck": BaseCheck.objects.create(sha="abc123", ok=False, summary="tests fail"),
    }


def test_every_page_loads_and_nothing_can_be_added_or_deleted(
    admin_client: Any, rows: dict[str, Any]
) -> None:
    for name in MODELS:
        pk = rows[name].pk
        assert admin_client.get(f"/admin/autopilot/{name}/").status_code == 200, name
        assert admin_client.get(f"/admin/autopilot/{name}/?q=a").status_code == 200, name
        assert admin_client.get(f"/admin/autopilot/{name}/add/").status_code == 403, name
        page = admin_client.get(f"/admin/autopilot/{name}/{pk}/change/")
        assert page.status_code == 200, name
        assert b'name="_save"' not in page.content, name  # shown, not editable
        assert admin_client.get(f"/admin/autopilot/{name}/{pk}/delete/").status_code == 403, name
    assert admin_client.get("/admin/autopilot/goal/?status__exact=approved").status_code == 200


def test_a_goal_shows_its_history_and_refuses_edits(
    admin_client: Any, rows: dict[str, Any]
) -> None:
    goal: Goal = rows["goal"]

    page = admin_client.get(f"/admin/autopilot/goal/{goal.pk}/change/")
    assert b"approved by op" in page.content  # the transitions inline

    response = admin_client.post(
        f"/admin/autopilot/goal/{goal.pk}/change/", {"status": "done", "title": "hacked"}
    )
    assert response.status_code == 403
    goal.refresh_from_db()
    assert (goal.status, goal.title) == ("approved", "Dark mode")
    hub_response = admin_client.post("/admin/autopilot/hub/1/change/", {"paused": ""})
    assert hub_response.status_code == 403
    assert Hub.objects.get().paused is True
