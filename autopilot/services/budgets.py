"""The spend ledger and the budget holds: the one writer of Spend and Hold.

Every model call's cost goes into the ledger (`spend_record`, the runtime's recorder hook) per
day, scope and goal. Before every call the runtime asks `spend_gate` (its gate hook): a call the
cap, the autopilot's budgets or its goal's budget refuse is held: the run records a Hold and
waits, holding no worker, until `holds_release` (each hub tick) finds the budget allows again
and resumes it from its checkpoint. The rules are `autopilot.spend.refusal`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from autopilot.events import BudgetEventType, budget_event
from autopilot.labels import goal_of, scope_of
from autopilot.models import GOAL_OPEN, OPERATOR_SCOPE, Goal, Hold, Spend
from autopilot.spend import (
    ZERO,
    Limits,
    Today,
    gate_totals,
    goals_spent,
    refusal,
    spend_day,
    spend_today,
)
from bursts.models import AGENT_LIVE, AgentRun, AgentStatus
from bursts.services import agent_resume
from bursts.services.agent_runs import agent_run_end
from core.redis import get_redis
from core.sql import sql_names
from psychonauts.errors import SuspendRun
from psychonauts.runtime.budget import CallCheck, CallSpend

logger = logging.getLogger(__name__)

# What a held run's next call was estimated to cost, by agent run id: a hold is released only
# when there is room for it (else it would be resumed and held again at every tick). Lost with
# Redis, a hold waits for any room at all.
NEED_KEY = "autopilot:holds:need"
# Zero-cost calls (the scripted, noop and shell providers) are counted in the process and
# written with the next paid call or after this long, not with a statement each.
FREE_FLUSH_S = 10.0
# A hold whose run is running (not waiting) that long after it was made is stale: the run was
# resumed by someone else and got past the gate.
HOLD_STALE_S = 60.0

_S = sql_names(Spend)
_G = sql_names(Goal, "g_")

# The ledger's rows, added to in one statement. A goal the labels name that does not exist
# (deleted, or a label typed by hand) counts under no goal; the rows are grouped after that, as
# one INSERT may not update a row twice. `total`: today's spend before this statement, read
# from the same snapshot (for the cap's crossing), or NULL.
_UPSERT = """
WITH up AS (
    INSERT INTO {table} ({day}, {scope}, {goal_id}, {usd}, {tokens_in}, {tokens_out}, {calls})
    SELECT v.day, v.scope, g.{g_id}, SUM(v.usd), SUM(v.tokens_in), SUM(v.tokens_out),
           SUM(v.calls)
    FROM unnest(%(day)s::date[], %(scope)s::text[], %(goal)s::bigint[], %(usd)s::numeric[],
                %(tokens_in)s::bigint[], %(tokens_out)s::bigint[], %(calls)s::int[])
         AS v(day, scope, goal, usd, tokens_in, tokens_out, calls)
    LEFT JOIN {g_table} g ON g.{g_id} = v.goal
    GROUP BY v.day, v.scope, g.{g_id}
    ON CONFLICT ON CONSTRAINT spend_once_per_day_scope_goal DO UPDATE SET
        {usd} = {table}.{usd} + EXCLUDED.{usd},
        {tokens_in} = {table}.{tokens_in} + EXCLUDED.{tokens_in},
        {tokens_out} = {table}.{tokens_out} + EXCLUDED.{tokens_out},
        {calls} = {table}.{calls} + EXCLUDED.{calls}
)
SELECT {{total}}
""".format(**_S, **_G)
_TODAY = "(SELECT COALESCE(SUM({usd}), 0) FROM {table} WHERE {day} = %(today)s)".format(**_S)
_UPSERTS = {True: _UPSERT.format(total=_TODAY), False: _UPSERT.format(total="NULL")}

Key = tuple[date, str, int | None]


@dataclass
class _Counts:
    usd: Decimal = ZERO
    tokens_in: int = 0
    tokens_out: int = 0
    calls: int = 0

    def add(self, usd: Decimal, tokens_in: int, tokens_out: int, calls: int = 1) -> None:
        self.usd += usd
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.calls += calls


class _FreeCalls:
    """Zero-cost calls counted in this process, not written yet (a threads worker runs many
    agents: a lock guards them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[Key, _Counts] = {}
        self.since = 0.0  # when the oldest of them came

    def take(self) -> dict[Key, _Counts]:
        rows, self.rows = self.rows, {}
        return rows


_free = _FreeCalls()


def _upsert(rows: dict[Key, _Counts], *, with_total: bool) -> Decimal | None:
    if not rows:
        return None
    keys = list(rows)
    params: dict[str, Any] = {
        "day": [k[0] for k in keys],
        "scope": [k[1] for k in keys],
        "goal": [k[2] for k in keys],
        "usd": [rows[k].usd for k in keys],
        "tokens_in": [rows[k].tokens_in for k in keys],
        "tokens_out": [rows[k].tokens_out for k in keys],
        "calls": [rows[k].calls for k in keys],
        "today": spend_day(),
    }
    with connection.cursor() as cursor:
        cursor.execute(_UPSERTS[with_total], params)
        row = cursor.fetchone()
    assert row is not None  # a SELECT of a subquery always has its row
    total: Decimal | None = row[0]
    return total


def spend_record(
    *, labels: Sequence[str], model: str, usd: Decimal, tokens_in: int, tokens_out: int
) -> None:
    """Count one model call in today's ledger, under its quantum's scope and goal.

    A paid call is one statement (with any zero-cost calls counted meanwhile); a zero-cost call
    waits in the process for the next paid one, or FREE_FLUSH_S. When this call takes today's
    spend to the global cap, `cap_reached` is published."""
    key: Key = (spend_day(), scope_of(labels), goal_of(labels))
    now = time.monotonic()
    with _free.lock:
        if usd == 0:
            if not _free.rows:
                _free.since = now
            _free.rows.setdefault(key, _Counts()).add(ZERO, tokens_in, tokens_out)
            if now - _free.since < FREE_FLUSH_S:
                return
            rows = _free.take()
        else:
            rows = _free.take()
            rows.setdefault(key, _Counts()).add(usd, tokens_in, tokens_out)
    cap = Limits.now().cap
    watch = cap is not None and usd > 0
    # Raises with the database's error; the zero-cost counts it carried are lost with it (not
    # put back: a row the database refuses would fail every paid call after it).
    before = _upsert(rows, with_total=watch)
    if watch and before is not None and cap is not None:
        after = before + usd
        if before < cap <= after:
            logger.warning("spending cap reached: $%s of $%s today", after, cap)
            budget_event("cap_reached", {"cap_usd": str(cap), "spent_usd": str(after)})
    logger.debug("spend recorded", extra={"scope": key[1], "goal_id": key[2], "model": model})


def spend_flush() -> None:
    """Write the zero-cost calls this process has counted (at exit, and for tests)."""
    with _free.lock:
        rows = _free.take()
    _upsert(rows, with_total=False)


def _flush_at_exit() -> None:
    try:
        spend_flush()
    except Exception:  # the database may be gone already: only call counts are lost
        logger.warning("could not write the zero-cost calls counted at exit", exc_info=True)


atexit.register(_flush_at_exit)


def spend_call_record(call: CallSpend) -> None:
    """The runtime's recorder hook."""
    spend_record(
        labels=call.labels,
        model=call.model,
        usd=call.usd,
        tokens_in=call.tokens_in,
        tokens_out=call.tokens_out,
    )


# --- the gate -----------------------------------------------------------------------------------


def spend_gate(check: CallCheck) -> None:
    """The runtime's gate hook, before every model call: a call a budget refuses is held (a
    Hold, then SuspendRun: the run waits, holding no worker). Work no budget applies to (the
    operator's, with no cap) costs no query."""
    scope, goal_id = scope_of(check.labels), goal_of(check.labels)
    limits = Limits.now()
    if limits.cap is None and scope == OPERATOR_SCOPE and goal_id is None:
        return
    today, goal_spent, goal_budget = gate_totals(day=spend_day(), scope=scope, goal_id=goal_id)
    refused = refusal(
        limits,
        scope=scope,
        goal_id=goal_id,
        need=check.estimate_usd,
        today=today,
        goal_spent=goal_spent,
        goal_budget=goal_budget,
    )
    if refused is None:
        return
    hold_scope, reason = refused
    hold_record(
        agent_run_id=check.agent_run_id,
        quantum_id=check.quantum_id,
        scope=hold_scope,
        reason=reason,
        need=check.estimate_usd,
    )
    raise SuspendRun(f"held by a budget: {reason}")


def hold_record(
    *, agent_run_id: int, quantum_id: int, scope: str, reason: str, need: Decimal
) -> None:
    """Record (or renew) the hold of a run a budget refused, and what its next call needs."""
    Hold.objects.bulk_create(
        [Hold(agent_run_id=agent_run_id, scope=scope, reason=reason)],
        update_conflicts=True,
        unique_fields=["agent_run"],
        update_fields=["scope", "reason"],
    )
    get_redis().hset(NEED_KEY, str(agent_run_id), str(need))
    logger.info(
        "agent run %s held: %s",
        agent_run_id,
        reason,
        extra={"agent_run_id": agent_run_id, "scope": scope},
    )
    budget_event(
        "run_held",
        {"agent_run_id": agent_run_id, "quantum_id": quantum_id, "scope": scope, "reason": reason},
    )


# --- releasing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Held:
    hold_id: int
    agent_run_id: int
    scope: str
    created_at: datetime
    status: str
    labels: list[str]


def _hold_drop(held: _Held, event: BudgetEventType, **payload: Any) -> None:
    Hold.objects.filter(pk=held.hold_id).delete()
    # Now, not on commit: the resumed run's task is sent on commit, and a run held again at once
    # records its new need before an on-commit delete would run.
    get_redis().hdel(NEED_KEY, str(held.agent_run_id))
    budget_event(event, {"agent_run_id": held.agent_run_id, "scope": held.scope, **payload})


def holds_release(*, limit: int = 500) -> int:
    """Resume the held runs whose budgets allow their next call again (a higher cap or budget,
    a new day); returns how many were resumed. Runs are resumed oldest hold first, each counted
    against the budgets before the next (a raised budget lets through what fits, not every run
    at once). A run whose goal is no longer open is cancelled; a hold whose run ended or was
    resumed by someone else is dropped."""
    if not _holds_exist():
        return 0
    rows = list(
        Hold.objects.order_by("created_at", "pk").values_list(
            "pk", "agent_run_id", "scope", "created_at", "agent_run__status",
            "agent_run__quantum__labels",
        )[:limit]
    )  # fmt: skip
    if not rows:
        return 0
    held = [_Held(*row) for row in rows]
    limits = Limits.now()
    spent = spend_today()
    total, autopilot = sum(spent.values(), ZERO), sum(spent.values(), ZERO) - spent[OPERATOR_SCOPE]
    goal_ids = {g for h in held if (g := goal_of(h.labels)) is not None}
    goals: dict[int, tuple[str, Decimal | None]] = {
        pk: (status, budget)
        for pk, status, budget in Goal.objects.filter(pk__in=goal_ids).values_list(
            "pk", "status", "budget_usd"
        )
    }
    by_goal = goals_spent(goal_ids)
    raw_needs = get_redis().hmget(NEED_KEY, [str(h.agent_run_id) for h in held])
    stale_before = timezone.now() - timedelta(seconds=HOLD_STALE_S)
    released = 0
    for h, raw in zip(held, raw_needs, strict=True):
        if h.status not in AGENT_LIVE:
            with transaction.atomic():
                _hold_drop(h, "dropped", reason=f"the run is {h.status}")
            continue
        scope, goal_id = scope_of(h.labels), goal_of(h.labels)
        goal_status, goal_budget = goals.get(goal_id, ("", None)) if goal_id else ("", None)
        if goal_status and goal_status not in GOAL_OPEN:
            _hold_cancel(h, f"goal {goal_id} is {goal_status}")
            continue
        need = Decimal(str(raw)) if raw else ZERO
        today = Today(total, autopilot, spent[scope])
        if refusal(
            limits,
            scope=scope,
            goal_id=goal_id,
            need=need,
            today=today,
            goal_spent=by_goal.get(goal_id, ZERO) if goal_id is not None else ZERO,
            goal_budget=goal_budget,
        ):
            continue
        if _hold_resume(h, stale=h.created_at < stale_before):
            released += 1
            total += need
            if scope != OPERATOR_SCOPE:
                autopilot += need
            spent[scope] += need
            if goal_id is not None:
                by_goal[goal_id] = by_goal.get(goal_id, ZERO) + need
    return released


_HOLDS_EXIST = "SELECT EXISTS (SELECT FROM {table})".format(**sql_names(Hold))


def _holds_exist() -> bool:
    """Each tick asks: a plain statement, not an ORM query to compile (none, most of the time)."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLDS_EXIST)
        row = cursor.fetchone()
    return bool(row and row[0])


def _hold_resume(held: _Held, *, stale: bool) -> bool:
    """Resume a held run (compare-and-set waiting -> running, its task sent on commit) and drop
    its hold; True when this call resumed it."""
    with transaction.atomic():
        # Locked, and skipped when another caller has it: one of two ticks releases it.
        if not Hold.objects.select_for_update(skip_locked=True).filter(pk=held.hold_id).exists():
            return False
        if agent_resume(agent_run_id=held.agent_run_id):
            _hold_drop(held, "released")
            logger.info("agent run %s resumed: its budget allows again", held.agent_run_id)
            return True
        status = AgentRun.objects.filter(pk=held.agent_run_id).values_list("status", flat=True)
        now = status.first()
        if now is None or now not in AGENT_LIVE:
            _hold_drop(held, "dropped", reason=f"the run is {now or 'gone'}")
        elif now == AgentStatus.RUNNING and stale:
            _hold_drop(held, "dropped", reason="the run was resumed meanwhile")
        # Else running, not waiting yet: it is suspending; the next call releases it.
        return False


def _hold_cancel(held: _Held, reason: str) -> None:
    """End a held run whose goal will not go on (abandoned, failed, done) and drop its hold."""
    with transaction.atomic():
        if not Hold.objects.select_for_update(skip_locked=True).filter(pk=held.hold_id).exists():
            return
        agent_run_end(
            agent_run_id=held.agent_run_id,
            status=AgentStatus.CANCELLED,
            result="",
            error=f"cancelled while held by a budget: {reason}",
            now=timezone.now(),
        )
        _hold_drop(held, "cancelled", reason=reason)
