"""Goals and waves over HTTP."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autopilot.models import Goal
from bursts.executor import Executor
from bursts.models import Wave
from tests.api.conftest import ApiClient, assert_problem
from tests.bursts.executors import scripted
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db


def test_it_proposes_lists_approves_and_abandons_goals(operator: ApiClient) -> None:
    response = operator.post(
        "/api/goals",
        {"title": "Faster pages", "success_criteria": "p95 under 100 ms", "priority": 1},
        **{"Idempotency-Key": "goal-1"},
    )
    assert response.status_code == 201
    goal = response.json()
    assert (goal["status"], goal["created_by"]) == ("proposed", "api:ci")
    again = operator.post(
        "/api/goals",
        {"title": "Faster pages", "success_criteria": "p95 under 100 ms", "priority": 1},
        **{"Idempotency-Key": "goal-1"},
    )
    assert again.json()["id"] == goal["id"] and Goal.objects.count() == 1
    listed = operator.get("/api/goals", {"status": "proposed"}).json()
    assert [g["id"] for g in listed["items"]] == [goal["id"]]
    assert operator.get(f"/api/goals/{goal['id']}").json()["title"] == "Faster pages"
    approved = operator.post(f"/api/goals/{goal['id']}/approve").json()
    assert (approved["status"], approved["approved_by"]) == ("approved", "api:ci")
    assert_problem(operator.post(f"/api/goals/{goal['id']}/approve"), 409, "conflict")
    abandoned = operator.post(f"/api/goals/{goal['id']}/abandon", {"reason": "not now"})
    assert abandoned.json()["status"] == "abandoned"


def test_it_refuses_a_goal_without_criteria_and_writes_nothing(operator: ApiClient) -> None:
    body = assert_problem(
        operator.post("/api/goals", {"title": "Vague", "success_criteria": "  "}),
        422,
        "validation",
    )
    assert body["errors"][0]["field"] == "body.success_criteria"
    assert not Goal.objects.exists()
    assert_problem(operator.get("/api/goals/424242"), 404, "not-found")


def test_it_starts_follows_and_cancels_a_wave(
    operator: ApiClient, executor: Callable[[Executor], Executor]
) -> None:
    executor(scripted)
    make_quantum("Work", labels=["api-wave"])
    response = operator.post("/api/waves", {"labels": ["api-wave"], "max_bursts": 1})
    assert response.status_code == 201, response.content
    wave = response.json()
    assert (wave["labels"], wave["started_by"], wave["max_bursts"]) == (
        ["api-wave"],
        "api:ci",
        1,
    )
    status = operator.get(f"/api/waves/{wave['id']}").json()
    assert status["wave"]["id"] == wave["id"] and isinstance(status["runs"], dict)
    assert [w["id"] for w in operator.get("/api/waves").json()["items"]] == [wave["id"]]
    if status["wave"]["status"] == "running":
        cancelled = operator.post(f"/api/waves/{wave['id']}/cancel", {"reason": "enough"})
        assert cancelled.json()["status"] == "cancelled"
    assert_problem(operator.post(f"/api/waves/{wave['id']}/cancel"), 409, "conflict")


def test_it_refuses_a_wave_over_a_bad_label(operator: ApiClient) -> None:
    assert_problem(operator.post("/api/waves", {"labels": ["no spaces allowed"]}),
                   422, "validation")  # fmt: skip
    assert_problem(operator.post("/api/waves", {"max_bursts": 0}), 422, "validation")
    assert not Wave.objects.exists()
    assert_problem(operator.get("/api/waves/999999"), 404, "not-found")
