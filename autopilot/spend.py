"""What the agents have spent, per day, scope and goal, and what the budgets leave (reads only;
`autopilot.services.budgets` writes the ledger and the holds).

A day is settings.TIME_ZONE's. The scopes are the hub states and `operator` (work the autopilot
did not file). The budgets, all per day except a goal's:

- the global cap (SPEND_CAP_DAY_USD, 0 = none) on every scope together;
- the autopilot's day budget (AUTOPILOT_BUDGET_DAY_USD) on the hub states together;
- each hub state's own (AUTOPILOT_BUDGET_STATE_USD; a state without one has only the above);
- a goal's budget_usd, on everything its agents ever spent.

A budget is spent when what it counts has reached it, or when the next call would take it over.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from autopilot.models import OPERATOR_SCOPE, SPEND_SCOPES, Goal, Hold, HubState, Spend
from core.sql import sql_names

ZERO = Decimal(0)

_S = sql_names(Spend)
_G = sql_names(Goal, "g_")
_H = sql_names(Hold, "h_")


def spend_day() -> date:
    """Today, as the ledger counts days (settings.TIME_ZONE)."""
    return timezone.localdate()


def usd(value: float | Decimal | str) -> Decimal:
    """An amount of dollars as the ledger counts them: a Decimal, exact for a setting's float
    as written (`0.1` is 0.1, not its binary neighbour)."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


def usd_text(value: float | Decimal | None) -> str:
    """An amount for a person: `$1,234.50` (None: `$0.00`)."""
    return f"${usd(value or 0):,.2f}"


@dataclass(frozen=True)
class Limits:
    """The budgets as configured now (settings are read on each call: tests and the operator
    change them at run time): the global cap (None: no cap), the autopilot's day budget and
    each hub state's own."""

    cap: Decimal | None
    day: Decimal
    states: dict[str, Decimal]

    @classmethod
    def now(cls) -> Limits:
        cap = usd(settings.SPEND_CAP_DAY_USD)
        states: dict[str, float] = settings.AUTOPILOT_BUDGET_STATE_USD
        return cls(
            cap=cap if cap > 0 else None,
            day=usd(settings.AUTOPILOT_BUDGET_DAY_USD),
            states={state: usd(amount) for state, amount in states.items()},
        )


def _over(spent: Decimal, need: Decimal, limit: Decimal) -> bool:
    return spent >= limit or spent + need > limit


@dataclass(frozen=True)
class Today:
    """Today's spend: in all, of the hub states together, and of one scope."""

    total: Decimal
    autopilot: Decimal
    scope: Decimal


def refusal(
    limits: Limits,
    *,
    scope: str,
    goal_id: int | None,
    need: Decimal,
    today: Today,
    goal_spent: Decimal = ZERO,
    goal_budget: Decimal | None = None,
) -> tuple[str, str] | None:
    """Whether a call of about `need` dollars in `scope` (for `goal_id`) must wait: None, or the
    budget that refuses it (a hold's scope: `cap`, `autopilot`, a hub state, `goal:<id>`) and
    why, for the operator."""
    if limits.cap is not None and _over(today.total, need, limits.cap):
        return "cap", (
            f"the day's spending cap is reached: ${today.total:.4f} of ${limits.cap:.4f} "
            "spent by every agent today"
        )
    if scope != OPERATOR_SCOPE:
        state_limit = limits.states.get(scope)
        if state_limit is not None and _over(today.scope, need, state_limit):
            return scope, (
                f"the {scope} budget is spent: ${today.scope:.4f} of ${state_limit:.4f} today"
            )
        if _over(today.autopilot, need, limits.day):
            return "autopilot", (
                f"the autopilot's day budget is spent: ${today.autopilot:.4f} of "
                f"${limits.day:.4f} today"
            )
    if goal_id is not None and goal_budget is not None and _over(goal_spent, need, goal_budget):
        return f"goal:{goal_id}", (
            f"goal {goal_id}'s budget is spent: ${goal_spent:.4f} of ${goal_budget:.4f}"
        )
    return None


# What the gate needs before a call, in one statement: today's rows (the unique index's day
# prefix), the goal's rows (spend_goal) and its budget.
_GATE_TOTALS = """
SELECT COALESCE(SUM(s.{usd}), 0),
       COALESCE(SUM(s.{usd}) FILTER (WHERE s.{scope} <> %(operator)s), 0),
       COALESCE(SUM(s.{usd}) FILTER (WHERE s.{scope} = %(scope)s), 0),
       (SELECT COALESCE(SUM(x.{usd}), 0) FROM {table} x WHERE x.{goal_id} = %(goal)s),
       (SELECT g.{g_budget_usd} FROM {g_table} g WHERE g.{g_id} = %(goal)s)
FROM {table} s WHERE s.{day} = %(day)s
""".format(**_S, **_G)


def gate_totals(
    *, day: date, scope: str, goal_id: int | None
) -> tuple[Today, Decimal, Decimal | None]:
    """Today's spend (in all, of the autopilot, of `scope`), the goal's spend and its budget."""
    with connection.cursor() as cursor:
        cursor.execute(
            _GATE_TOTALS, {"day": day, "scope": scope, "goal": goal_id, "operator": OPERATOR_SCOPE}
        )
        row = cursor.fetchone()
    assert row is not None  # an aggregate always has its row
    total, autopilot, in_scope, goal_spent, goal_budget = row
    return Today(total, autopilot, in_scope), goal_spent, goal_budget


@dataclass(frozen=True)
class CapStatus:
    cap_usd: Decimal | None
    spent_usd: Decimal
    reached: bool


@dataclass(frozen=True)
class BudgetStatus:
    """Everything the hub's tick needs of the budgets, read in one statement."""

    spent: dict[str, Decimal]  # today, per scope (every scope, 0 when nothing)
    left: dict[str, Decimal | None]  # today, per hub state (None = unlimited)
    cap: CapStatus
    holds: int

    @property
    def total(self) -> Decimal:
        return self.cap.spent_usd


def _status(spent: dict[str, Decimal], holds: int, limits: Limits) -> BudgetStatus:
    total = sum(spent.values(), ZERO)
    autopilot = total - spent[OPERATOR_SCOPE]
    cap = CapStatus(limits.cap, total, limits.cap is not None and total >= limits.cap)
    left: dict[str, Decimal | None] = {}
    for state in HubState.values:
        room = [limits.day - autopilot]
        if state in limits.states:
            room.append(limits.states[state] - spent[state])
        if limits.cap is not None:
            room.append(limits.cap - total)
        left[state] = max(min(room), ZERO)
    return BudgetStatus(spent=spent, left=left, cap=cap, holds=holds)


_STATUS = """
SELECT (SELECT COUNT(*) FROM {h_table}), t.{scope}, t.usd
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT {scope}, SUM({usd}) AS usd FROM {table} WHERE {day} = %s GROUP BY {scope}
) AS t ON true
""".format(**_S, **_H)


def budget_status() -> BudgetStatus:
    """Today's spend per scope, what each hub state may still spend, the cap and the holds."""
    with connection.cursor() as cursor:
        cursor.execute(_STATUS, [spend_day()])
        rows = cursor.fetchall()
    spent = dict.fromkeys(SPEND_SCOPES, ZERO)
    for _, scope, usd in rows:
        if scope is not None:
            spent[scope] = usd
    return _status(spent, int(rows[0][0]), Limits.now())


def spend_today() -> dict[str, Decimal]:
    """What each scope has spent today (every scope, 0 when nothing)."""
    return budget_status().spent


def cap_status() -> CapStatus:
    """The global cap, what every agent spent today, and whether that reached it."""
    return budget_status().cap


def budget_left(scope: str) -> Decimal | None:
    """What `scope` may still spend today: for a hub state the least of its own budget, the
    autopilot's day budget and the cap; for the operator the cap. None: no limit."""
    status = budget_status()
    if scope in status.left:
        return status.left[scope]
    if status.cap.cap_usd is None:
        return None
    return max(status.cap.cap_usd - status.cap.spent_usd, ZERO)


def holds_count() -> int:
    return Hold.objects.count()


@dataclass(frozen=True)
class DaySpend:
    day: date
    usd: dict[str, Decimal] = field(default_factory=dict)  # every scope, 0 when nothing
    calls: int = 0

    @property
    def total(self) -> Decimal:
        return sum(self.usd.values(), ZERO)


_BY_DAY = """
SELECT {day}, {scope}, SUM({usd}), SUM({calls}) FROM {table}
WHERE {day} > %s GROUP BY {day}, {scope}
""".format(**_S)


def spend_by_day(days: int = 14) -> list[DaySpend]:
    """The last `days` days (today included, oldest first), each with its spend per scope."""
    today = spend_day()
    first = today - timedelta(days=max(days, 1) - 1)
    with connection.cursor() as cursor:
        cursor.execute(_BY_DAY, [first - timedelta(days=1)])
        rows = cursor.fetchall()
    usd: dict[date, dict[str, Decimal]] = {}
    calls: dict[date, int] = {}
    for day, scope, spent, n in rows:
        usd.setdefault(day, {})[scope] = spent
        calls[day] = calls.get(day, 0) + int(n)
    out = []
    for offset in range((today - first).days + 1):
        day = first + timedelta(days=offset)
        by_scope = dict.fromkeys(SPEND_SCOPES, ZERO)
        by_scope.update(usd.get(day, {}))
        out.append(DaySpend(day, by_scope, calls.get(day, 0)))
    return out


def goals_spent(goal_ids: Collection[int]) -> dict[int, Decimal]:
    """What each goal's agents have spent in all (0 when nothing), in one query."""
    spent = dict.fromkeys(goal_ids, ZERO)
    rows = (
        Spend.objects.filter(goal_id__in=list(goal_ids))
        .values("goal_id")
        .annotate(usd=Sum("usd"))
        .values_list("goal_id", "usd")
    )
    for goal_id, usd in rows:
        spent[goal_id] = usd
    return spent
