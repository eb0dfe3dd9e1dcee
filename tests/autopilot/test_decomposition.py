"""Decomposition on a real Celery worker: an approved goal's planner agent (the scripted provider,
steered by the goal's `script:<name>` label, which its epic carries) hands over a plan; a refused
plan goes back to a new attempt with its problems, up to the tries, then the goal fails with the
reason; a valid one files the goal's quanta with their dependencies and labels."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from autopilot.models import Goal, GoalStatus, GoalTransition
from autopilot.services.goals.lifecycle import goal_approve, goal_create
from autopilot.services.goals.planning import goals_decompose_due
from autopilot.services.goals.progress import goals_progress
from bursts.models import AgentRun
from bursts.services import wave_start
from core.celery import app
from psychonauts.models import ToolCall
from quanta.models import Dependency, Quantum, QuantumStatus
from quanta.services import quantum_close
from tests.bursts.conftest import Worker, wait_wave, worker_env
from tests.polling import wait_for
from tether.models import ChangeReview, ChangeStatus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

S = GoalStatus
SETTLED = {S.ACTIVE, S.FAILED}


@pytest.fixture
def planner_env(repo: Path, settings: Any, tmp_path: Path) -> dict[str, str]:
    settings.AUTOPILOT_PLAN_TRIES = 3
    return worker_env(
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(tmp_path / "home"),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_PROVIDER="",
        ANNIHILATION_TEXT_FLUSH_S="0",
        ANNIHILATION_AUTOPILOT_PLAN_TRIES="3",
        REDIS_URL=django_settings.REDIS_URL,
    )


@pytest.fixture
def idle_worker(planner_env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    """A threads worker (no beat: only the planner's own chain moves the goal) on the test's
    repository, not started yet."""
    worker = Worker(env=planner_env, tmp=tmp_path, name=f"goals-{os.getpid()}", beat=False)
    yield worker
    worker.stop()
    connection.close()


@pytest.fixture
def planner_worker(idle_worker: Worker) -> Worker:
    return idle_worker.start()


def decompose(script: str, **fields: Any) -> Goal:
    goal = goal_create(
        title="Serve the greeting over HTTP",
        success_criteria="GET /greet answers hello",
        labels=["web", f"script:{script}"],
        priority=2,
        **fields,
    )
    goal_approve(goal_id=goal.pk, by="op")
    assert goals_decompose_due() == 1
    settled: Goal = wait_for(
        lambda: Goal.objects.filter(pk=goal.pk, status__in=SETTLED).first(),
        timeout=60,
        what=f"goal {goal.pk} planned or failed",
    )
    return settled


def epic_of(goal: Goal) -> int:
    assert goal.epic_id is not None, "the goal has no epic"
    return goal.epic_id


def planner_runs(goal: Goal) -> list[AgentRun]:
    return list(AgentRun.objects.filter(quantum_id=epic_of(goal)).order_by("attempt"))


def test_refused_plans_go_back_to_the_planner_until_a_valid_one_is_filed(
    planner_worker: Worker,
) -> None:
    goal = decompose("goal-retries")

    assert goal.status == S.ACTIVE, goal.reason
    assert goal.plan_tries == 2
    runs = planner_runs(goal)
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert all(r.role == "goal-planner" and r.status == "done" for r in runs)
    # Each new attempt is told what was wrong with the one before.
    assert "Your previous plan was refused (try 1 of 3" in runs[1].context
    assert "not JSON" in runs[1].context
    assert "try 2 of 3" in runs[2].context
    assert "the dependencies form a cycle a -> b -> a" in runs[2].context
    # Within attempt 2 the tool itself refused the cyclic plan, so the model saw why.
    refused = ToolCall.objects.get(agent_run=runs[1], name="submit_plan")
    assert refused.is_error and "cycle a -> b -> a" in refused.output

    epic = Quantum.objects.get(pk=epic_of(goal))
    assert (epic.kind, epic.status) == ("epic", QuantumStatus.DEFERRED)
    assert epic.labels == [
        "autopilot",
        "autopilot:executing",
        f"goal:{goal.pk}",
        "web",
        "script:goal-retries",
    ]
    children = {q.title: q for q in Quantum.objects.filter(parent=epic)}
    assert sorted(children) == ["Add the endpoint", "Add the schema", "Document the endpoint"]
    schema, api, docs = (
        children["Add the schema"],
        children["Add the endpoint"],
        children["Document the endpoint"],
    )
    base = ["autopilot", "autopilot:executing", f"goal:{goal.pk}", "web"]
    assert schema.labels == [*base, "db"] and api.labels == [*base, "api"]
    assert docs.labels == base  # no script label: it steers the planner, not the quanta
    assert (schema.priority, api.priority) == (1, 2)  # the plan's, else the goal's
    assert (schema.complexity, schema.complexity_auto) == ("trivial", False)  # the plan's
    assert api.complexity_auto  # none in the plan: the classifier's
    assert schema.verify_commands == ["test -f calc.py"]
    assert schema.acceptance == "The table exists."
    assert f"Part of goal #{goal.pk}" in schema.body
    waits = set(
        Dependency.objects.filter(quantum__parent=epic, kind="blocks").values_list(
            "quantum_id", "depends_on_id"
        )
    )
    assert waits == {(api.pk, schema.pk), (docs.pk, api.pk), (docs.pk, schema.pk)}
    assert (schema.status, schema.open_blockers, docs.open_blockers) == ("open", 0, 2)
    assert "planned by" in goal.reason and "Schema, then the endpoint" in goal.reason
    history = list(
        GoalTransition.objects.filter(goal=goal)
        .order_by("created_at", "id")
        .values_list("from_status", "to_status")
    )
    assert history == [
        ("", S.PROPOSED),
        (S.PROPOSED, S.APPROVED),
        (S.APPROVED, S.DECOMPOSING),
        (S.DECOMPOSING, S.ACTIVE),
    ]

    # A second look (the tick after the chain, a redelivered task) files nothing again.
    assert goals_progress() == 0
    assert goals_progress(goal_id=goal.pk) == 0
    assert Quantum.objects.filter(parent=epic).count() == 3


def test_a_goal_fails_with_the_reason_after_three_refused_plans(planner_worker: Worker) -> None:
    goal = decompose("goal-bad")

    assert goal.status == S.FAILED
    assert goal.reason.startswith("no valid plan after 3 tries; the last one's problems:")
    assert "not JSON" in goal.reason
    assert goal.plan_tries == 3 and goal.finished_at is not None
    assert [r.attempt for r in planner_runs(goal)] == [1, 2, 3]
    assert not Quantum.objects.filter(parent_id=goal.epic_id).exists()
    last = GoalTransition.objects.filter(goal=goal).latest("id")
    assert (last.from_status, last.to_status) == (S.DECOMPOSING, S.FAILED)
    assert last.by.endswith("_goal_plan")


def test_a_plan_given_as_the_final_answer_is_filed(planner_worker: Worker) -> None:
    goal = decompose("goal-answer")

    assert goal.status == S.ACTIVE, goal.reason
    assert goal.plan_tries == 0
    one, two = Quantum.objects.filter(parent_id=goal.epic_id).order_by("pk")
    assert (one.title, two.title) == ("Do the first thing", "Do the second thing")
    assert list(two.dependencies.values_list("depends_on_id", flat=True)) == [one.pk]
    assert "given as text" in goal.reason


def test_a_goal_whose_quanta_are_closed_is_verified_by_the_worker_and_done(
    planner_worker: Worker,
) -> None:
    goal = decompose("goal-answer", verify_commands=["test -f calc.py", "python3 calc.py"])
    assert goal.status == S.ACTIVE, goal.reason
    for child in Quantum.objects.filter(parent_id=epic_of(goal)):
        quantum_close(quantum_id=child.pk, reason="nothing to change")

    assert goals_progress() == 1  # -> verifying; the verification is sent to the worker

    done = wait_for(
        lambda: Goal.objects.filter(pk=goal.pk, status__in={S.DONE, S.FAILED}).first(),
        timeout=60,
        what="the goal verified",
    )
    assert done.status == S.DONE, done.reason
    assert "2 command(s) passed" in done.reason
    assert Quantum.objects.get(pk=epic_of(goal)).status == QuantumStatus.CLOSED


def test_a_planner_run_whose_message_was_lost_is_sent_again(
    idle_worker: Worker, settings: Any, redis_client: Any
) -> None:
    goal = goal_create(title="Lost", success_criteria="found", labels=["script:goal-answer"])
    goal_approve(goal_id=goal.pk, by="op")
    assert goals_decompose_due() == 1
    app.control.purge()  # the broker lost the planner's message before any worker took it
    idle_worker.start()
    goal.refresh_from_db()
    run = AgentRun.objects.get(quantum_id=epic_of(goal))
    assert run.status == "pending"

    assert goals_progress() == 0  # not long enough to be lost: a queue may just be busy
    settings.AUTOPILOT_STUCK_S = 60
    long_ago = timezone.now() - timedelta(minutes=5)
    AgentRun.objects.filter(pk=run.pk).update(created_at=long_ago)
    Goal.objects.filter(pk=goal.pk).update(updated_at=long_ago)
    goals_progress()

    planned = wait_for(
        lambda: Goal.objects.filter(pk=goal.pk, status__in=SETTLED).first(),
        timeout=60,
        what="the goal planned after the resend",
    )
    assert planned.status == S.ACTIVE, planned.reason
    assert AgentRun.objects.filter(quantum_id=epic_of(goal)).count() == 1  # the same run


@pytest.fixture
def merging_worker(planner_env: dict[str, str], tmp_path: Path, settings: Any) -> Iterator[Worker]:
    """The planner's worker, with beat (the Tether's sweep) and low-risk changes merged."""
    settings.TETHER_AUTO_MERGE_LOW_RISK = True
    settings.TETHER_TARGET_BRANCH = ""
    env = {
        **planner_env,
        "ANNIHILATION_TETHER_AUTO_MERGE_LOW_RISK": "true",
        "ANNIHILATION_TETHER_SWEEP_INTERVAL_S": "0.5",
    }
    worker = Worker(env=env, tmp=tmp_path, name=f"goals-m-{os.getpid()}", beat=True).start()
    yield worker
    worker.stop()
    connection.close()


def test_a_goal_is_planned_executed_merged_verified_and_done(
    merging_worker: Worker, repo: Path
) -> None:
    goal = goal_create(
        title="Leave notes",
        success_criteria="every quantum left its note",
        verify_commands=["ls notes"],
    )
    goal_approve(goal_id=goal.pk, by="op")
    goals_decompose_due()
    goal = wait_for(
        lambda: Goal.objects.filter(pk=goal.pk, status__in=SETTLED).first(),
        timeout=60,
        what="the goal planned",
    )
    assert goal.status == S.ACTIVE, goal.reason
    wave = wave_start(labels=[f"goal:{goal.pk}"], started_by="test")
    wait_wave(wave.pk, timeout=120)

    def moved() -> Goal | None:
        goals_progress()
        return Goal.objects.filter(pk=goal.pk, status__in={S.DONE, S.FAILED}).first()

    done = wait_for(moved, timeout=120, what="the goal done")
    assert done.status == S.DONE, (done.reason, merging_worker.log.read_text()[-3000:])
    children = list(Quantum.objects.filter(parent_id=epic_of(goal)))
    assert len(children) == 2 and all(c.status == "closed" for c in children)
    assert (
        ChangeReview.objects.filter(quantum__in=children, status=ChangeStatus.MERGED).count() == 2
    )
