"""Reads of the autopilot for the pages and the CLI: the hub's status with today's spend against
its budgets, its history, spend per state per day, holds and findings, and goals with their
progress, decomposition and planner runs. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.db.models import QuerySet

from autopilot.goal_selectors import (
    GoalChild,
    GoalDetail,
    GoalSummary,
    goal_detail,
    goals_counts,
    goals_for_ui,
)
from autopilot.models import (
    OPERATOR_SCOPE,
    SPEND_SCOPES,
    Finding,
    Goal,
    GoalStatus,
    GoalTransition,
    Hold,
    Hub,
    HubTransition,
)
from autopilot.spend import (
    BudgetStatus,
    CapStatus,
    budget_status,
    goals_spent,
    spend_by_day,
    usd,
)
from bursts.models import AgentRun
from psychonauts.selectors import AgentSpend, quanta_spend
from quanta.models import Quantum, QuantumStatus

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
            budget_usd=None if (budget := budgets.get(scope)) is None else usd(budget),
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
        day_budget_usd=usd(settings.AUTOPILOT_BUDGET_DAY_USD),
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


# --- goals (read through autopilot.goal_selectors, with their spend) --------------------------


@dataclass(frozen=True)
class GoalRow:
    goal: Goal
    closed: int  # the goal's quanta closed
    total: int  # the goal's quanta
    spend_usd: Decimal

    @property
    def waiting_for_approval(self) -> bool:
        return self.goal.status == GoalStatus.PROPOSED


def goal_rows(summaries: list[GoalSummary]) -> list[GoalRow]:
    spend = goals_spent([s.goal.pk for s in summaries])
    return [
        GoalRow(goal=s.goal, closed=s.closed, total=s.quanta, spend_usd=spend.get(s.goal.pk, ZERO))
        for s in summaries
    ]


def goal_row(goal: Goal) -> GoalRow:
    """A goal just made or decided (no quanta of its own counted: see `goal_page`)."""
    return goal_rows([GoalSummary(goal, 0, 0)])[0]


GOALS_SHOWN = 500  # goals the Goals page and `goals list` show at most


def goals_list(*, status: str | None = None, limit: int = GOALS_SHOWN) -> list[GoalRow]:
    """Goals grouped by status (proposed first: they wait for the operator), each status in
    priority-then-age order, with progress and spend."""
    rank = {s: n for n, s in enumerate(GOAL_STATUS_ORDER)}
    summaries = goals_for_ui(status=status or None, limit=limit)
    summaries.sort(key=lambda s: rank.get(s.goal.status, len(rank)))  # stable: keeps the order
    return goal_rows(summaries)


def goal_counts() -> dict[str, int]:
    """How many goals are in each status, in the Goals page's order."""
    counts = goals_counts()
    return {status: counts.get(status, 0) for status in GOAL_STATUS_ORDER}


def quantum_in_a_goal(*, quantum_id: int) -> bool:
    """Whether the quantum is one of a goal's (a child of a goal's epic)."""
    return Quantum.objects.filter(pk=quantum_id, parent__goal__isnull=False).exists()


@dataclass(frozen=True)
class GoalPage:
    """A goal as its page and `goals show` present it."""

    row: GoalRow
    detail: GoalDetail
    last_verify: GoalTransition | None  # the last time its verify commands decided
    agents: AgentSpend  # what the agents of its epic and its quanta took and cost

    @property
    def goal(self) -> Goal:
        return self.row.goal

    @property
    def transitions(self) -> list[GoalTransition]:
        return self.detail.transitions

    @property
    def children(self) -> list[GoalChild]:
        return self.detail.children

    @property
    def planner_runs(self) -> list[AgentRun]:
        return self.detail.planner_runs


def goal_page(*, goal_id: int) -> GoalPage:
    """A goal with its history, its quanta, its planner runs, its spend and its last
    verification; GoalNotFound when there is none."""
    detail = goal_detail(goal_id=goal_id)
    closed = sum(1 for c in detail.children if c.status == QuantumStatus.CLOSED)
    summary = GoalSummary(detail.goal, len(detail.children), closed)
    verified = [t for t in detail.transitions if t.from_status == GoalStatus.VERIFYING]
    return GoalPage(
        row=goal_rows([summary])[0],
        detail=detail,
        last_verify=verified[-1] if verified else None,
        agents=quanta_spend(quantum_ids=_goal_quantum_ids(detail)),
    )


def _goal_quantum_ids(detail: GoalDetail) -> list[int]:
    """The goal's epic (its planner runs there) and its quanta."""
    epic = [detail.goal.epic_id] if detail.goal.epic_id is not None else []
    return epic + [c.quantum_id for c in detail.children]
