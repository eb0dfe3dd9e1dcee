"""Goals: created with their fields checked, moved only along their allowed transitions (each a
history row and an event), abandoned with their quanta, and done once their quanta's changes are
merged and their own verify commands pass on the integration branch."""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from autopilot.errors import GoalNotFound, IllegalGoalTransition, InvalidGoal
from autopilot.goal_selectors import goal_detail, goals_counts, goals_for_ui
from autopilot.models import GOAL_TRANSITIONS, Goal, GoalSource, GoalStatus, GoalTransition
from autopilot.services.goals.lifecycle import (
    goal_abandon,
    goal_approve,
    goal_create,
    goal_transition,
)
from autopilot.services.goals.planning import goals_decompose_due
from autopilot.services.goals.progress import goals_progress
from autopilot.services.goals.verification import goal_verify
from bursts.models import AgentRun
from core.models import Event
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.tools import ToolContext, tool_execute
from quanta.fields import VERIFY_COMMAND_CHECK
from quanta.models import Quantum, QuantumStatus
from quanta.services import quantum_close, quantum_create, quantum_reopen
from tests.tether.test_changes import finished_run
from tether.models import ChangeStatus
from tether.services import change_approve, change_review_create, reviews_due
from tether.services.merge_queue import merge_queue_run

S = GoalStatus


def make_goal(**fields: Any) -> Goal:
    values: dict[str, Any] = {"title": "Greet the user", "success_criteria": "hello.py greets"}
    values.update(fields)
    return goal_create(**values)


def history(goal: Goal) -> list[tuple[str, str, str]]:
    return list(
        GoalTransition.objects.filter(goal=goal)
        .order_by("created_at", "id")
        .values_list("from_status", "to_status", "by")
    )


def epic_of(goal: Goal) -> int:
    assert goal.epic_id is not None, "the goal has no epic"
    return goal.epic_id


def set_status(goal: Goal, status: str) -> None:
    Goal.objects.filter(pk=goal.pk).update(status=status)


# --- creating ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_creates_a_proposed_goal_with_its_history_row_and_event() -> None:
    goal = goal_create(
        title="  Greet the user  ",
        success_criteria="hello.py prints hello",
        description="A greeting.",
        verify_commands=["python3 hello.py"],
        priority=1,
        labels=["ux", "ux", "script:goal-plan"],
        budget_usd=Decimal("2.5"),
        by="alice",
    )

    goal.refresh_from_db()
    assert (goal.title, goal.status, goal.priority, goal.source) == (
        "Greet the user",
        S.PROPOSED,
        1,
        GoalSource.OPERATOR,
    )
    assert goal.labels == ["ux", "script:goal-plan"]
    assert goal.verify_commands == ["python3 hello.py"]
    assert goal.budget_usd == Decimal("2.5000") and goal.created_by == "alice"
    assert history(goal) == [("", S.PROPOSED, "alice")]
    event = Event.objects.filter(topic="autopilot:goals").latest("id")
    assert event.type == "goal_created" and event.payload["goal_id"] == goal.pk


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"title": "   "}, "title: required"),
        ({"title": "t" * 501}, "title: at most 500 characters"),
        ({"title": "a\x00b"}, "title: contains a NUL character"),
        ({"success_criteria": ""}, "success_criteria: required"),
        ({"description": "\ud800"}, "description: is not valid UTF-8"),
        ({"priority": 5}, "priority: from 0 (critical) to 4"),
        ({"priority": True}, "priority: a whole number"),
        ({"labels": ["two words"]}, "labels[0]: 'two words' is not a label"),
        ({"labels": ["goal:3"]}, "labels: 'goal:3' is reserved"),
        ({"labels": ["autopilot:executing"]}, "reserved for the autopilot"),
        ({"budget_usd": Decimal("-1")}, "budget_usd: must be 0 or more"),
        ({"budget_usd": Decimal("NaN")}, "budget_usd: must be 0 or more"),
        ({"source": "nowhere"}, "source: one of operator"),
        (
            {"verify_commands": ["pytest -q", "rm -rf /"]},
            "verify_commands[1]: 'rm -rf /' is refused by the command guard",
        ),
        ({"verify_commands": ["  "]}, "verify_commands[0]: a command must be non-empty"),
    ],
)
def test_it_refuses_a_bad_field_naming_it(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidGoal, match=None) as caught:
        make_goal(**fields)

    assert message in str(caught.value)
    assert not Goal.objects.exists()


# --- transitions ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_approves_a_proposed_goal_and_refuses_to_approve_it_twice() -> None:
    goal = make_goal()

    approved = goal_approve(goal_id=goal.pk, by="bob")

    assert (approved.status, approved.approved_by) == (S.APPROVED, "bob")
    with pytest.raises(
        IllegalGoalTransition, match=r"it is approved \(only from failed, proposed\)"
    ):
        goal_approve(goal_id=goal.pk, by="bob")
    with pytest.raises(InvalidGoal, match="by: say who approves"):
        goal_approve(goal_id=goal.pk, by="")
    with pytest.raises(GoalNotFound):
        goal_approve(goal_id=goal.pk + 1000, by="bob")
    assert history(goal) == [("", S.PROPOSED, ""), (S.PROPOSED, S.APPROVED, "bob")]
    event = Event.objects.filter(topic="autopilot:goals").latest("id")
    assert (event.type, event.payload["from_status"], event.payload["status"]) == (
        "goal_status_changed",
        S.PROPOSED,
        S.APPROVED,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("start", list(S.values))
def test_each_transition_is_allowed_only_from_its_statuses(start: str) -> None:
    for target in S.values:
        goal = make_goal(title=f"{start} to {target}")
        set_status(goal, start)
        allowed = target in GOAL_TRANSITIONS[start]

        if allowed:
            moved = goal_transition(goal.pk, to=target, reason="test", by="t")
            assert moved.status == target
            assert history(goal)[-1] == (start, target, "t")
        else:
            with pytest.raises(IllegalGoalTransition, match=f"it is {start}"):
                goal_transition(goal.pk, to=target, reason="test", by="t")
            assert Goal.objects.get(pk=goal.pk).status == start
            assert len(history(goal)) == 1  # only its creation


@pytest.mark.django_db
@pytest.mark.parametrize("start", list(S.values))
def test_the_operator_actions_respect_the_guards(start: str) -> None:
    goal = make_goal()
    set_status(goal, start)

    if start in (S.PROPOSED, S.FAILED):
        assert goal_approve(goal_id=goal.pk, by="op").status == S.APPROVED
    else:
        with pytest.raises(IllegalGoalTransition):
            goal_approve(goal_id=goal.pk, by="op")
    goal2 = make_goal(title="another")
    set_status(goal2, start)
    if start in (S.DONE, S.ABANDONED):
        with pytest.raises(IllegalGoalTransition):
            goal_abandon(goal_id=goal2.pk, by="op")
    else:
        assert goal_abandon(goal_id=goal2.pk, by="op").status == S.ABANDONED


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_approvals_approve_once() -> None:
    goal = make_goal()
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def approve(by: str) -> None:
        barrier.wait()
        try:
            goal_approve(goal_id=goal.pk, by=by)
            outcomes.append("approved")
        except IllegalGoalTransition:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(outcomes) == ["approved", "refused"]
    assert [row[1] for row in history(goal)] == [S.PROPOSED, S.APPROVED]


@pytest.mark.django_db
def test_only_approved_goals_are_decomposed_most_urgent_first(repo: Path) -> None:
    low = make_goal(title="low", priority=3)
    high = make_goal(title="high", priority=0)
    make_goal(title="never approved")
    for goal in (low, high):
        goal_approve(goal_id=goal.pk, by="op")

    assert goals_decompose_due(limit=1) == 1
    high.refresh_from_db()
    assert high.status == S.DECOMPOSING and high.epic is not None
    assert Goal.objects.get(pk=low.pk).status == S.APPROVED
    assert goals_decompose_due() == 1
    assert goals_decompose_due() == 0
    epic = high.epic
    assert (epic.kind, epic.status) == ("epic", QuantumStatus.DEFERRED)
    assert epic.labels == ["autopilot", "autopilot:executing", f"goal:{high.pk}"]
    assert "## Success criteria\nhello.py greets" in epic.body
    run = AgentRun.objects.get(quantum=epic)
    assert (run.role, run.agent_id, run.attempt) == ("goal-planner", f"{epic.pk}_goal_plan", 1)
    assert "## Goal #" in run.context and "## The plan's format" in run.context


# --- abandoning -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_abandoning_closes_the_goals_quanta_that_are_not_running_and_its_epic(repo: Path) -> None:
    goal = make_goal()
    goal_approve(goal_id=goal.pk, by="op")
    goals_decompose_due()
    goal.refresh_from_db()
    assert goal.epic_id is not None
    children = [quantum_create(title=f"child {n}", parent_id=goal.epic_id) for n in range(4)]
    Quantum.objects.filter(pk=children[1].pk).update(status=QuantumStatus.IN_PROGRESS)
    quantum_close(quantum_id=children[2].pk, reason="done earlier")
    Quantum.objects.filter(pk=children[3].pk).update(status=QuantumStatus.BLOCKED)

    abandoned = goal_abandon(goal_id=goal.pk, by="op", reason="not needed any more")

    assert (abandoned.status, abandoned.reason) == (S.ABANDONED, "not needed any more")
    assert abandoned.finished_at is not None
    rows = {q.pk: q for q in Quantum.objects.filter(pk__in=[c.pk for c in children])}
    assert rows[children[0].pk].close_reason == "goal abandoned"
    assert rows[children[1].pk].status == QuantumStatus.IN_PROGRESS  # its run finishes
    assert rows[children[2].pk].close_reason == "done earlier"
    assert rows[children[3].pk].close_reason == "goal abandoned"
    epic = Quantum.objects.get(pk=goal.epic_id)
    assert (epic.status, epic.close_reason) == (QuantumStatus.CLOSED, "goal abandoned")
    assert history(goal)[-1] == (S.DECOMPOSING, S.ABANDONED, "op")
    with pytest.raises(IllegalGoalTransition):
        goal_approve(goal_id=goal.pk, by="op")


# --- completion -------------------------------------------------------------------------------


def planned_goal(**fields: Any) -> tuple[Goal, list[Quantum]]:
    """An active goal, planned by the shipped planner script (two quanta, the second waiting on
    the first), its planner executed here."""
    goal = make_goal(**fields)
    goal_approve(goal_id=goal.pk, by="op")
    goals_decompose_due()
    goal.refresh_from_db()
    run = AgentRun.objects.get(quantum_id=epic_of(goal))
    assert agent_run_execute(agent_run_id=run.pk).status == "done"
    assert goals_progress() == 1
    goal.refresh_from_db()
    assert goal.status == S.ACTIVE, goal.reason
    return goal, list(Quantum.objects.filter(parent_id=goal.epic_id).order_by("pk"))


def merge(quantum: Quantum, files: dict[str, str | None]) -> None:
    review = change_review_create(quantum_run_id=finished_run(quantum, files).pk)
    assert review is not None
    change_approve(change_id=review.pk)
    assert merge_queue_run().merged == [review.pk]


@pytest.fixture
def target(repo: Path, settings: Any) -> Path:
    settings.TETHER_AUTO_MERGE_LOW_RISK = False
    settings.TETHER_TARGET_BRANCH = ""
    settings.TETHER_VERIFY_COMMANDS = []
    return repo


@pytest.mark.django_db
def test_a_goal_whose_changes_are_merged_is_verified_on_the_integration_branch_and_done(
    target: Path,
) -> None:
    goal, (notes, check) = planned_goal(verify_commands=["test -f hello.py", "python3 calc.py"])
    assert goals_progress() == 0  # nothing changed: nothing moves

    merge(notes, {"hello.py": "print('hello')\n"})
    quantum_close(quantum_id=notes.pk, reason="merged")
    assert goals_progress() == 0  # the second quantum is still open
    quantum_close(quantum_id=check.pk, reason="nothing to change")  # no change: no review

    assert goals_progress() == 1
    assert Goal.objects.get(pk=goal.pk).status == S.VERIFYING
    done = goal_verify(goal_id=goal.pk)

    assert done is not None and done.status == S.DONE
    assert done.reason.startswith("verified on main at ") and "2 command(s) passed" in done.reason
    assert done.finished_at is not None
    epic = Quantum.objects.get(pk=epic_of(goal))
    assert (epic.status, epic.close_reason) == (QuantumStatus.CLOSED, "goal done")
    assert [row[:2] for row in history(goal)][-3:] == [
        (S.DECOMPOSING, S.ACTIVE),
        (S.ACTIVE, S.VERIFYING),
        (S.VERIFYING, S.DONE),
    ]
    assert not (Path(target.parent / "home" / "goals" / f"verify-{goal.pk}")).exists()


@pytest.mark.django_db
def test_a_failing_verify_command_fails_the_goal_and_keeps_its_quanta(target: Path) -> None:
    goal, children = planned_goal(verify_commands=["test -f missing.txt"])
    for child in children:
        quantum_close(quantum_id=child.pk, reason="done")
    assert goals_progress() == 1

    failed = goal_verify(goal_id=goal.pk)

    assert failed is not None and failed.status == S.FAILED
    assert "verify failed on main at" in failed.reason
    assert "FAILED: `test -f missing.txt` (exit status 1)" in failed.reason
    assert Quantum.objects.filter(parent_id=goal.epic_id, status="closed").count() == 2
    assert Quantum.objects.get(pk=epic_of(goal)).status == QuantumStatus.DEFERRED
    # Approved again, it is planned anew (the earlier quanta named in the planner's context),
    # on its epic deferred again (the operator had closed it meanwhile).
    quantum_close(quantum_id=epic_of(goal), reason="by hand")
    goal_approve(goal_id=goal.pk, by="op")
    assert goals_decompose_due() == 1
    run = AgentRun.objects.filter(quantum_id=epic_of(goal)).latest("attempt")
    assert run.attempt == 2 and "Quanta filed for this goal before" in run.context
    assert Quantum.objects.get(pk=epic_of(goal)).status == QuantumStatus.DEFERRED
    assert "test -f missing.txt" in run.context


@pytest.mark.django_db
def test_a_pending_change_keeps_the_goal_active_and_a_reopened_quantum_sends_it_back(
    target: Path,
) -> None:
    goal, (notes, check) = planned_goal()
    review = change_review_create(quantum_run_id=finished_run(notes, {"a.txt": "a\n"}).pk)
    assert review is not None and review.status == ChangeStatus.PENDING
    for child in (notes, check):
        quantum_close(quantum_id=child.pk, reason="done")

    assert goals_progress() == 0  # the change waits for the operator
    change_approve(change_id=review.pk)
    assert goals_progress() == 0  # queued
    merge_queue_run()
    assert goals_progress() == 1
    assert Goal.objects.get(pk=goal.pk).status == S.VERIFYING

    quantum_reopen(quantum_id=check.pk, reason="not quite")
    assert goals_progress() == 1
    back = Goal.objects.get(pk=goal.pk)
    assert back.status == S.ACTIVE and "reopened" in back.reason
    assert goal_verify(goal_id=goal.pk) is None  # not verifying: nothing runs


@pytest.mark.django_db
def test_a_quantum_closed_before_its_branch_is_reviewed_keeps_the_goal_active(
    target: Path,
) -> None:
    """Draining a done run closes its quantum at once; its review comes after, from a task. In
    between, the quantum must not pass for one that made no change."""
    goal, (notes, check) = planned_goal()
    run = finished_run(notes, {"a.txt": "a\n"})
    for child in (notes, check):
        quantum_close(quantum_id=child.pk, reason="done")
    reviews_due(runs=[(run.pk, notes.pk)])

    assert goals_progress() == 0  # the review is due: whether it changed anything is not known
    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None and review.status == ChangeStatus.PENDING
    assert goals_progress() == 0  # now known: a change waiting for the operator
    change_approve(change_id=review.pk)
    merge_queue_run()
    assert goals_progress() == 1
    assert Goal.objects.get(pk=goal.pk).status == S.VERIFYING

    # The quantum reopened, run and closed again between two ticks: its new run's review is due.
    again = finished_run(notes, {"b.txt": "b\n"})
    reviews_due(runs=[(again.pk, notes.pk)])
    assert goals_progress() == 1
    assert Goal.objects.get(pk=goal.pk).status == S.ACTIVE


@pytest.mark.django_db
def test_a_goal_without_verify_commands_is_done_once_its_quanta_are(target: Path) -> None:
    goal, children = planned_goal()
    for child in children:
        quantum_close(quantum_id=child.pk, reason="done")
    assert goals_progress() == 1

    done = goal_verify(goal_id=goal.pk)

    assert done is not None and done.status == S.DONE
    assert "no verify commands" in done.reason


@pytest.mark.django_db
def test_the_selectors_show_counts_progress_and_a_goals_decomposition(target: Path) -> None:
    goal, (notes, check) = planned_goal()
    make_goal(title="waiting", priority=0)
    review = change_review_create(quantum_run_id=finished_run(notes, {"a.txt": "a\n"}).pk)
    assert review is not None
    quantum_close(quantum_id=check.pk, reason="done")

    counts = goals_counts()
    listed = goals_for_ui()
    detail = goal_detail(goal_id=goal.pk)

    assert counts[S.ACTIVE] == 1 and counts[S.PROPOSED] == 1 and counts[S.DONE] == 0
    assert set(counts) == set(S.values)
    assert [(row.goal.title, row.quanta, row.closed) for row in listed] == [
        ("waiting", 0, 0),
        ("Greet the user", 2, 1),
    ]
    assert [row.goal.pk for row in goals_for_ui(status=S.ACTIVE)] == [goal.pk]
    assert [t.to_status for t in detail.transitions] == [
        S.PROPOSED,
        S.APPROVED,
        S.DECOMPOSING,
        S.ACTIVE,
    ]
    assert detail.epic is not None and detail.epic.pk == goal.epic_id
    first, second = detail.children
    assert (first.quantum_id, first.change_id, first.change_status) == (
        notes.pk,
        review.pk,
        ChangeStatus.PENDING,
    )
    assert (second.status, second.waits_on, second.change_status) == ("closed", (notes.pk,), "")
    assert [(r.role, r.attempt, r.status) for r in detail.planner_runs] == [
        ("goal-planner", 1, "done")
    ]
    with pytest.raises(GoalNotFound):
        goal_detail(goal_id=goal.pk + 1000)


# --- the agents' tools ------------------------------------------------------------------------


def tool_ctx(tmp_path: Path, agent_id: str = "7_contemplate") -> ToolContext:
    return ToolContext(
        agent_run_id=1,
        agent_id=agent_id,
        attempt=1,
        quantum_id=7,
        role="contemplator",
        depth=0,
        workspace=tmp_path,
        shared=False,
    )


def test_submit_plan_accepts_a_valid_plan_and_returns_every_problem_of_a_bad_one(
    tmp_path: Path,
) -> None:
    good = {"quanta": [{"key": "a", "title": "A", "acceptance": "a done"}]}
    bad = {
        "quanta": [
            {"key": "a", "title": "A", "depends_on": ["a"]},
            {"key": "b", "title": "B", "acceptance": "b", "verify_commands": ["rm -rf /"]},
        ]
    }

    accepted = tool_execute(tool_ctx(tmp_path), "submit_plan", good, ["submit_plan"])
    refused = tool_execute(tool_ctx(tmp_path), "submit_plan", bad, ["submit_plan"])

    assert not accepted.is_error and accepted.output.startswith("plan accepted: 1 quanta")
    assert refused.is_error
    assert "the plan has 3 problem(s)" in refused.output
    for expected in ("quanta[0].acceptance: required", "cycle a -> a", "'rm -rf /' is refused"):
        assert expected in refused.output


@pytest.mark.django_db
def test_propose_goal_files_a_proposed_goal_from_contemplation_within_the_limit(
    tmp_path: Path, settings: Any
) -> None:
    settings.AUTOPILOT_PROPOSALS_MAX = 1
    args = {"title": "Test the parser", "success_criteria": "the parser has tests", "priority": 3}

    first = tool_execute(tool_ctx(tmp_path), "propose_goal", args, ["propose_goal"])
    second = tool_execute(tool_ctx(tmp_path), "propose_goal", args, ["propose_goal"])

    assert not first.is_error and "waits for the operator's approval" in first.output
    goal = Goal.objects.get()
    assert (goal.status, goal.source, goal.created_by, goal.priority) == (
        S.PROPOSED,
        GoalSource.CONTEMPLATION,
        "7_contemplate",
        3,
    )
    assert second.is_error and "already wait for the operator" in second.output
    settings.AUTOPILOT_PROPOSALS_MAX = 5
    refused = tool_execute(
        tool_ctx(tmp_path),
        "propose_goal",
        {**args, "verify_commands": ["rm -rf /"]},
        ["propose_goal"],
    )
    assert refused.is_error and "'rm -rf /' is refused by the command guard" in refused.output
    assert Goal.objects.count() == 1


@pytest.mark.django_db
def test_a_conflicted_change_keeps_the_goal_active_until_its_correction_is_done(
    target: Path,
) -> None:
    goal, (notes, check) = planned_goal()
    review = change_review_create(quantum_run_id=finished_run(notes, {"calc.py": "B = 2\n"}).pk)
    assert review is not None
    merge(quantum_create(title="someone else"), {"calc.py": "A = 1\n"})
    change_approve(change_id=review.pk)
    merge_queue_run()
    review.refresh_from_db()
    assert review.status == ChangeStatus.CONFLICTED and review.correction_id is not None
    for child in (notes, check):
        quantum_close(quantum_id=child.pk, reason="done")

    assert goals_progress() == 0  # the change is not in the integration branch
    quantum_close(quantum_id=review.correction_id, reason="resolved by hand")

    assert goals_progress() == 1
    assert Goal.objects.get(pk=goal.pk).status == S.VERIFYING


@pytest.mark.django_db
def test_a_plan_that_cannot_be_filed_is_refused_as_a_try_and_files_nothing(repo: Path) -> None:
    goal = make_goal()
    goal_approve(goal_id=goal.pk, by="op")
    goals_decompose_due()
    goal.refresh_from_db()
    run = AgentRun.objects.get(quantum_id=epic_of(goal))
    agent_run_execute(agent_run_id=run.pk)
    # The quanta's own door refuses what the plan's checks let through (its guard changed).
    with VERIFY_COMMAND_CHECK.replaced(lambda command: "refused at the door"):
        assert goals_progress() == 0

    goal.refresh_from_db()
    assert (goal.status, goal.plan_tries) == (S.DECOMPOSING, 1)
    assert "the plan could not be filed: verify_commands" in goal.reason
    assert not Quantum.objects.filter(parent_id=epic_of(goal)).exists()  # not half of it
    retry = AgentRun.objects.filter(quantum_id=epic_of(goal)).latest("attempt")
    assert retry.attempt == 2 and "refused at the door" in retry.context
