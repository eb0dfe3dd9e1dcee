"""Reads of the autopilot for the pages and the CLI: the hub's status with today's spend against
its budgets, its history, spend per state per day, holds and findings, and goals with their
progress, decomposition and planner runs. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When

from autopilot.errors import GoalNotFound
from autopilot.models import (
    OPERATOR_SCOPE,
    SPEND_SCOPES,
    Finding,
    Goal,
    GoalStatus,
    GoalTransition,
    Hold,
    Hub,
    HubState,
    HubTransition,
)
from autopilot.spend import BudgetStatus, CapStatus, budget_status, goals_spent, spend_by_day
from bursts.models import AgentRun
from quanta.models import Dependency, DependencyKind, Quantum, QuantumStatus
from tether.models import ChangeReview

ZERO = Decimal(0)
SPEND_DAYS = 14  # days of spend the history page shows

# The Goals page lists goals grouped by status in this order: what waits for the operator first,
# then the work in flight, then what is over.
GOAL_STATUS_ORDER: tuple[str, ...] = (
    GoalStatus.PROPOSED,
    GoalStatus.APPROVED,
    GoalStatus.DECOMPOSING,
    GoalStatus.ACTIVE,
    GoalStatus.VERIFYING,
    GoalStatus.FAILED,
    GoalStatus.DONE,
    GoalStatus.ABANDONED,
)


# --- the hub ----------------------------------------------------------------------------------


def hub_get() -> Hub:
    """The hub's row, or (before its first tick or operator action) the row it starts as:
    resting and paused."""
    return Hub.objects.filter(pk=1).first() or Hub(pk=1)


def _money(value: float | Decimal | None) -> Decimal | None:
    return None if value is None else Decimal(str(value))


@dataclass(frozen=True)
class StateSpend:
    """Today's spend of one scope (a hub state or the operator) against its budget."""

    scope: str
    spent_usd: Decimal
    budget_usd: Decimal | None  # None: no budget of its own (resting, the operator)
    left_usd: Decimal | None  # what the autopilot may still spend in it today; None: unlimited

    @property
    def over(self) -> bool:
        return self.left_usd is not None and self.left_usd <= 0


@dataclass(frozen=True)
class HubStatus:
    hub: Hub
    cap: CapStatus
    spend: list[StateSpend]
    spent_autopilot_usd: Decimal  # today, every hub state together
    day_budget_usd: Decimal
    transitions: list[HubTransition] = field(default_factory=list)

    @property
    def spent_today_usd(self) -> Decimal:
        return sum((s.spent_usd for s in self.spend), ZERO)


def hub_spend_today(status: BudgetStatus | None = None) -> list[StateSpend]:
    """Every scope's spend today, each hub state against its budget, then the operator's."""
    status = status or budget_status()
    budgets: dict[str, float] = settings.AUTOPILOT_BUDGET_STATE_USD
    return [
        StateSpend(
            scope=scope,
            spent_usd=status.spent.get(scope, ZERO),
            budget_usd=_money(budgets.get(scope)),
            left_usd=status.left.get(scope) if scope != OPERATOR_SCOPE else None,
        )
        for scope in SPEND_SCOPES
    ]


def hub_status(*, transitions: int = 5) -> HubStatus:
    """The hub as the dashboard card and `manage.py autopilot status` show it."""
    budgets = budget_status()
    spend = hub_spend_today(budgets)
    return HubStatus(
        hub=hub_get(),
        cap=budgets.cap,
        spend=spend,
        spent_autopilot_usd=sum((s.spent_usd for s in spend if s.scope != OPERATOR_SCOPE), ZERO),
        day_budget_usd=_money(settings.AUTOPILOT_BUDGET_DAY_USD) or ZERO,
        transitions=hub_transitions_recent(limit=transitions) if transitions else [],
    )


def hub_transitions() -> QuerySet[HubTransition]:
    """The hub's history, newest first (the history page pages through it)."""
    return HubTransition.objects.order_by("-created_at", "-id")


def hub_transitions_recent(*, limit: int) -> list[HubTransition]:
    return list(hub_transitions()[:limit])


@dataclass(frozen=True)
class DayRow:
    """One day of spend, its cells in SPEND_SCOPES order (a table row)."""

    day: date
    cells: list[Decimal]
    total: Decimal


def spend_per_day(*, days: int = SPEND_DAYS) -> list[DayRow]:
    """Spend per scope for each of the last `days` days, today first, days without any too."""
    return [
        DayRow(day=d.day, cells=[d.usd[scope] for scope in SPEND_SCOPES], total=d.total)
        for d in reversed(spend_by_day(days))
    ]


def holds_list(*, limit: int = 50) -> list[Hold]:
    """Agent runs waiting on a budget, oldest first (the order they resume in)."""
    return list(Hold.objects.select_related("agent_run").order_by("created_at", "id")[:limit])


@dataclass(frozen=True)
class RecentFindings:
    filed: list[Finding]
    skipped: list[Finding]


def findings_recent(*, limit: int = 20) -> RecentFindings:
    """What the scanners filed lately, and what they found but did not file (and why)."""
    filed = Finding.objects.filter(filed_at__isnull=False).order_by("-filed_at", "-id")
    skipped = Finding.objects.exclude(skipped="").order_by("-last_seen", "-id")
    return RecentFindings(filed=list(filed[:limit]), skipped=list(skipped[:limit]))


# --- goals ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoalRow:
    goal: Goal
    closed: int  # the goal's quanta closed
    total: int  # the goal's quanta
    spend_usd: Decimal

    @property
    def waiting_for_approval(self) -> bool:
        return self.goal.status == GoalStatus.PROPOSED


def _status_rank() -> Case:
    return Case(
        *(When(status=s, then=Value(n)) for n, s in enumerate(GOAL_STATUS_ORDER)),
        default=Value(len(GOAL_STATUS_ORDER)),
        output_field=IntegerField(),
    )


def _progress(epic_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(closed, total) of the children of each epic."""
    rows = (
        Quantum.objects.filter(parent_id__in=epic_ids)
        .values("parent_id")
        .annotate(total=Count("id"), closed=Count("id", filter=Q(status=QuantumStatus.CLOSED)))
    )
    return {row["parent_id"]: (row["closed"], row["total"]) for row in rows}


def goal_rows(goals: list[Goal]) -> list[GoalRow]:
    progress = _progress([g.epic_id for g in goals if g.epic_id is not None])
    spend = goals_spent([g.pk for g in goals])
    rows = []
    for goal in goals:
        closed, total = progress.get(goal.epic_id, (0, 0)) if goal.epic_id else (0, 0)
        rows.append(
            GoalRow(goal=goal, closed=closed, total=total, spend_usd=spend.get(goal.pk, ZERO))
        )
    return rows


def goals_list(*, status: str | None = None, limit: int | None = None) -> list[GoalRow]:
    """Goals grouped by status (proposed first), then by priority and age, with progress and
    spend."""
    qs = Goal.objects.all()
    if status:
        qs = qs.filter(status=status)
    qs = qs.order_by(_status_rank(), "priority", "created_at", "id")
    goals = list(qs[:limit] if limit else qs)
    return goal_rows(goals)


def goal_counts() -> dict[str, int]:
    """How many goals are in each status (every status, in page order)."""
    counts = dict(Goal.objects.values_list("status").annotate(n=Count("id")).order_by())
    return {status: counts.get(status, 0) for status in GOAL_STATUS_ORDER}


def goal_get(*, goal_id: int) -> Goal:
    goal = Goal.objects.select_related("epic").filter(pk=goal_id).first()
    if goal is None:
        raise GoalNotFound(f"no goal #{goal_id}")
    return goal


@dataclass(frozen=True)
class GoalChild:
    """One quantum of a goal's decomposition."""

    quantum: Quantum
    waits_on: list[int]  # the goal's quanta (or others) it cannot start before
    change: ChangeReview | None  # its latest change review


@dataclass(frozen=True)
class GoalDetail:
    row: GoalRow
    transitions: list[GoalTransition]
    children: list[GoalChild]
    planner_runs: list[AgentRun]
    last_verify: GoalTransition | None  # the last time the goal's verify commands decided

    @property
    def goal(self) -> Goal:
        return self.row.goal


def goal_children(*, epic_id: int) -> list[GoalChild]:
    quanta = list(Quantum.objects.filter(parent_id=epic_id).order_by("id"))
    ids = [q.pk for q in quanta]
    waits: dict[int, list[int]] = {}
    for quantum_id, depends_on_id in (
        Dependency.objects.filter(quantum_id__in=ids, kind=DependencyKind.BLOCKS)
        .order_by("depends_on_id")
        .values_list("quantum_id", "depends_on_id")
    ):
        waits.setdefault(quantum_id, []).append(depends_on_id)
    changes: dict[int, ChangeReview] = {}
    for change in ChangeReview.objects.filter(quantum_id__in=ids).order_by("created_at", "id"):
        changes[change.quantum_id] = change  # the newest wins
    return [
        GoalChild(quantum=q, waits_on=waits.get(q.pk, []), change=changes.get(q.pk)) for q in quanta
    ]


def goal_transitions(*, goal_id: int) -> list[GoalTransition]:
    return list(GoalTransition.objects.filter(goal_id=goal_id).order_by("created_at", "id"))


def goal_detail(*, goal_id: int) -> GoalDetail:
    """A goal with its history, its quanta, its planner runs and its last verification."""
    goal = goal_get(goal_id=goal_id)
    transitions = goal_transitions(goal_id=goal_id)
    verified = [t for t in transitions if t.from_status == GoalStatus.VERIFYING]
    runs: list[AgentRun] = []
    children: list[GoalChild] = []
    if goal.epic_id is not None:
        children = goal_children(epic_id=goal.epic_id)
        runs = list(AgentRun.objects.filter(quantum_id=goal.epic_id).order_by("created_at", "id"))
    return GoalDetail(
        row=goal_rows([goal])[0],
        transitions=transitions,
        children=children,
        planner_runs=runs,
        last_verify=verified[-1] if verified else None,
    )


def hub_states() -> list[str]:
    return list(HubState.values)
