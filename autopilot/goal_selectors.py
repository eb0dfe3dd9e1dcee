"""Reads of goals for the hub's snapshot, the pages and the CLI: counts per status, a page of
goals with their progress, one goal with its history, epic, quanta and planner runs. Nothing
here writes; each function is a fixed, small number of indexed queries."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q

from autopilot.errors import GoalNotFound
from autopilot.models import Goal, GoalStatus, GoalTransition
from autopilot.services.goals.planning import PLANNER_ROLE
from bursts.models import AgentRun
from quanta.models import Dependency, DependencyKind, Quantum, QuantumStatus
from tether.models import ChangeReview


def goals_counts() -> dict[str, int]:
    """How many goals are in each status (every status, zero included)."""
    counts = dict(Goal.objects.values_list("status").annotate(n=Count("id")).order_by())
    return {status: counts.get(status, 0) for status in GoalStatus.values}


@dataclass(frozen=True)
class GoalSummary:
    goal: Goal
    quanta: int  # the goal's quanta (its epic's children)
    closed: int  # of which closed


def goals_for_ui(*, status: str | None = None, limit: int = 200) -> list[GoalSummary]:
    """Goals (of one status, or all) in priority-then-age order, with their quanta counted."""
    goals = Goal.objects.order_by("priority", "created_at", "id")
    if status:
        goals = goals.filter(status=status)
    rows = list(goals[:limit])
    epics = [g.epic_id for g in rows if g.epic_id is not None]
    counts = {
        row["parent_id"]: (row["total"], row["closed"])
        for row in Quantum.objects.filter(parent_id__in=epics)
        .values("parent_id")
        .annotate(total=Count("id"), closed=Count("id", filter=Q(status=QuantumStatus.CLOSED)))
        .order_by()
    }
    return [
        GoalSummary(g, *counts.get(g.epic_id, (0, 0)) if g.epic_id is not None else (0, 0))
        for g in rows
    ]


@dataclass(frozen=True)
class GoalChild:
    """One quantum of a goal, with what it waits on and where its change stands."""

    quantum_id: int
    title: str
    status: str
    priority: int
    complexity: str
    waits_on: tuple[int, ...]  # its `blocks` dependencies
    change_id: int | None  # its latest change review
    change_status: str  # "" when it made no change (yet)


@dataclass(frozen=True)
class GoalDetail:
    goal: Goal
    transitions: list[GoalTransition]  # oldest first
    epic: Quantum | None
    children: list[GoalChild]
    planner_runs: list[AgentRun]  # oldest attempt first


def goal_detail(*, goal_id: int) -> GoalDetail:
    """A goal with its history, its epic, its quanta (and their changes) and its planner runs;
    GoalNotFound when there is none."""
    goal = Goal.objects.select_related("epic").filter(pk=goal_id).first()
    if goal is None:
        raise GoalNotFound(f"no goal #{goal_id}")
    transitions = list(GoalTransition.objects.filter(goal_id=goal_id).order_by("created_at", "id"))
    if goal.epic_id is None:
        return GoalDetail(goal, transitions, None, [], [])
    quanta = list(
        Quantum.objects.filter(parent_id=goal.epic_id)
        .order_by("id")
        .only("pk", "title", "status", "priority", "complexity")
    )
    ids = [q.pk for q in quanta]
    waits: dict[int, list[int]] = {}
    for quantum_id, blocker_id in (
        Dependency.objects.filter(quantum_id__in=ids, kind=DependencyKind.BLOCKS)
        .order_by("depends_on_id")
        .values_list("quantum_id", "depends_on_id")
    ):
        waits.setdefault(quantum_id, []).append(blocker_id)
    changes: dict[int, tuple[int, str]] = {}
    for change_id, quantum_id, change_status in (
        ChangeReview.objects.filter(quantum_id__in=ids)
        .order_by("quantum_id", "-created_at", "-id")
        .distinct("quantum_id")
        .values_list("pk", "quantum_id", "status")
    ):
        changes[quantum_id] = (change_id, change_status)
    children = [
        GoalChild(
            quantum_id=q.pk,
            title=q.title,
            status=q.status,
            priority=q.priority,
            complexity=q.complexity,
            waits_on=tuple(waits.get(q.pk, ())),
            change_id=changes[q.pk][0] if q.pk in changes else None,
            change_status=changes[q.pk][1] if q.pk in changes else "",
        )
        for q in quanta
    ]
    runs = list(
        AgentRun.objects.filter(quantum_id=goal.epic_id, role=PLANNER_ROLE).order_by(
            "attempt", "id"
        )
    )
    return GoalDetail(goal, transitions, goal.epic, children, runs)
