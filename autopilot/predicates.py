"""The hub's rules: pure functions of a snapshot, and `decide`, which applies them in order.

    healing        something needs healing (stuck agents, failing endpoints, a repository's
                   integration branch failing its checks with no healing quantum yet) and the
                   healing budget has money left;
    executing      approved goals await decomposition (or a planner runs), autopilot quanta are
                   ready or in progress, and the executing budget has money left;
    improving      nothing to execute, the improving budget has money left and the last scan is
                   older than AUTOPILOT_SCAN_EVERY_S;
    contemplating  nothing to execute, the contemplating budget has money left, the last
                   contemplation is older than AUTOPILOT_CONTEMPLATE_EVERY_S and some repository
                   has fewer than AUTOPILOT_PROPOSALS_MAX proposals waiting for the Tether;
    resting        otherwise: nothing to do, or the day's budget is spent.

Every reason is a sentence for the operator, with the figures that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from autopilot.models import HubState
from autopilot.snapshot import READY_CAP, WORK_STATES, RepositoryState, Snapshot
from autopilot.spend import usd_text


@dataclass(frozen=True)
class Decision:
    state: str
    reason: str


# --- figures in words ---------------------------------------------------------------------------


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def _since(s: Snapshot, at: datetime | None) -> float | None:
    return None if at is None else (s.at - at).total_seconds()


# --- budgets ------------------------------------------------------------------------------------


def budget_allows(s: Snapshot, state: str) -> bool:
    """Today's budget of `state` has money left (None: no limit)."""
    left = s.budget_left.get(state)
    return left is None or left > 0


def day_spent_usd(s: Snapshot) -> Decimal:
    """What the autopilot's own work spent today (every hub state, not the operator's)."""
    return sum((s.spent_today.get(state, Decimal(0)) for state in WORK_STATES), Decimal(0))


def day_budget_spent(s: Snapshot) -> bool:
    """No hub state that spends has money left today."""
    return all(not budget_allows(s, state) for state in WORK_STATES)


def cap_reached(s: Snapshot) -> bool:
    return s.cap_reached


def _budget_words(s: Snapshot, state: str) -> str:
    left = s.budget_left.get(state)
    if left is None:
        return f"no limit on the {state} budget"
    total = s.limits.budgets.states.get(state)
    whose = f"the {state} budget's {usd_text(total)}" if total is not None else "the day's budget"
    return f"{usd_text(max(left, Decimal(0)))} of {whose} left today"


# --- healing ------------------------------------------------------------------------------------


def has_stuck_agents(s: Snapshot) -> bool:
    return bool(s.stuck)


def has_failing_endpoints(s: Snapshot) -> bool:
    return bool(s.endpoints)


def bases_to_heal(s: Snapshot) -> tuple[RepositoryState, ...]:
    """The repositories whose integration branch failed its checks often enough in a row, with
    no healing quantum filed for it open."""
    return tuple(
        r
        for r in s.repositories
        if r.base_failures >= s.limits.base_failures and r.base_healing_id is None
    )


def base_needs_healing(s: Snapshot) -> bool:
    return bool(bases_to_heal(s))


def needs_healing(s: Snapshot) -> bool:
    return has_stuck_agents(s) or has_failing_endpoints(s) or base_needs_healing(s)


def healing_words(s: Snapshot) -> str:
    """What needs healing, as a clause."""
    parts: list[str] = []
    if s.stuck:
        ids = ", ".join(f"{a.agent_id} (run {a.agent_run_id})" for a in s.stuck[:5])
        more = f" and {len(s.stuck) - 5} more" if len(s.stuck) > 5 else ""
        parts.append(
            f"{_n(len(s.stuck), 'agent')} stuck with no progress for "
            f"{duration(min(a.quiet_s for a in s.stuck))} or more: {ids}{more}"
        )
    for e in s.endpoints[:5]:
        parts.append(
            f"endpoint {e.provider}/{e.model} failing ({_n(e.failures, 'failure')} in a row)"
        )
    if len(s.endpoints) > 5:
        parts.append(f"{len(s.endpoints) - 5} more endpoints failing")
    for r in bases_to_heal(s):
        parts.append(
            f"the integration branch of {r.name} failed its checks "
            f"{_n(r.base_failures, 'time')} in a row (at {r.base_sha[:10] or 'an unknown commit'}; "
            f"the limit is {s.limits.base_failures})"
        )
    return "; ".join(parts)


# --- executing ----------------------------------------------------------------------------------


def has_work(s: Snapshot) -> bool:
    """Approved goals await decomposition (or a planner runs), or autopilot quanta are ready or
    in progress."""
    return bool(s.goals_approved or s.goals_decomposing or s.ready or s.in_progress)


def needs_wave(s: Snapshot) -> bool:
    """Autopilot quanta are ready and no running wave covers them."""
    return s.ready > 0 and s.wave_id is None


def may_execute(s: Snapshot) -> bool:
    return has_work(s) and budget_allows(s, HubState.EXECUTING)


def work_words(s: Snapshot) -> str:
    parts: list[str] = []
    if s.ready:
        count = f"{READY_CAP} or more" if s.ready >= READY_CAP else str(s.ready)
        parts.append(f"{count} autopilot {'quantum' if s.ready == 1 else 'quanta'} ready")
    if s.in_progress:
        count = f"{READY_CAP} or more" if s.in_progress >= READY_CAP else str(s.in_progress)
        parts.append(f"{count} in progress")
    if s.goals_approved:
        parts.append(f"{_n(s.goals_approved, 'approved goal')} awaiting decomposition")
    if s.goals_decomposing:
        parts.append(f"{_n(s.goals_decomposing, 'goal')} being decomposed")
    if s.wave_id is not None:
        parts.append(f"wave {s.wave_id} running")
    return ", ".join(parts)


# --- improving and contemplating ----------------------------------------------------------------


def idle(s: Snapshot) -> bool:
    return not has_work(s)


def scan_due(s: Snapshot) -> bool:
    since = _since(s, s.scanned_at)
    return since is None or since >= s.limits.scan_every_s


def contemplation_due(s: Snapshot) -> bool:
    since = _since(s, s.contemplated_at)
    return since is None or since >= s.limits.contemplate_every_s


def proposals_room(s: Snapshot) -> tuple[RepositoryState, ...]:
    """The repositories with fewer than AUTOPILOT_PROPOSALS_MAX contemplation proposals waiting
    (contemplation proposes in each of them)."""
    return tuple(r for r in s.repositories if r.proposals < s.limits.proposals_max)


def proposals_waiting(s: Snapshot) -> int:
    """Contemplation's proposals waiting in every repository."""
    return sum(r.proposals for r in s.repositories)


def proposals_full(s: Snapshot) -> bool:
    return not proposals_room(s)


def may_improve(s: Snapshot) -> bool:
    return idle(s) and budget_allows(s, HubState.IMPROVING) and scan_due(s)


def may_contemplate(s: Snapshot) -> bool:
    return (
        idle(s)
        and budget_allows(s, HubState.CONTEMPLATING)
        and contemplation_due(s)
        and not proposals_full(s)
    )


def _last(s: Snapshot, at: datetime | None, what: str, every_s: float) -> str:
    since = _since(s, at)
    if since is None:
        return f"no {what} yet (one every {duration(every_s)})"
    return f"the last {what} was {duration(since)} ago (one every {duration(every_s)})"


# --- the decision -------------------------------------------------------------------------------


def decide(s: Snapshot) -> Decision:
    """The state the hub should be in, and why."""
    if needs_healing(s) and budget_allows(s, HubState.HEALING):
        return Decision(
            HubState.HEALING,
            f"healing: {healing_words(s)}; {_budget_words(s, HubState.HEALING)}",
        )
    if may_execute(s):
        return Decision(
            HubState.EXECUTING,
            f"work to do: {work_words(s)}; {_budget_words(s, HubState.EXECUTING)}",
        )
    if may_improve(s):
        return Decision(
            HubState.IMPROVING,
            f"nothing to execute and a scan is due: "
            f"{_last(s, s.scanned_at, 'scan', s.limits.scan_every_s)}; "
            f"{_budget_words(s, HubState.IMPROVING)}",
        )
    if may_contemplate(s):
        return Decision(
            HubState.CONTEMPLATING,
            f"nothing to execute and a contemplation is due: "
            f"{_last(s, s.contemplated_at, 'contemplation', s.limits.contemplate_every_s)}, "
            f"{_n(proposals_waiting(s), 'proposal')} waiting (at most "
            f"{s.limits.proposals_max} per repository); "
            f"{_budget_words(s, HubState.CONTEMPLATING)}",
        )
    return Decision(HubState.RESTING, _rest_reason(s))


def _rest_reason(s: Snapshot) -> str:
    if day_budget_spent(s):
        return (
            f"resting: the day's budget is spent ({usd_text(day_spent_usd(s))} spent today of "
            f"{usd_text(s.limits.budgets.day)})"
        )
    waits: list[str] = []
    if needs_healing(s):
        waits.append(
            f"healing waits for budget ({healing_words(s)}; {_budget_words(s, HubState.HEALING)})"
        )
    if has_work(s):
        waits.append(
            f"work waits for budget ({work_words(s)}; {_budget_words(s, HubState.EXECUTING)})"
        )
    if waits:
        return "resting: " + "; ".join(waits)
    parts = ["nothing to do: no autopilot quanta ready, no approved goals"]
    if not budget_allows(s, HubState.IMPROVING):
        parts.append(f"no scan: {_budget_words(s, HubState.IMPROVING)}")
    else:
        parts.append(_last(s, s.scanned_at, "scan", s.limits.scan_every_s))
    if proposals_full(s):
        parts.append(
            f"no contemplation: {_n(proposals_waiting(s), 'proposal')} wait for approval "
            f"(at most {s.limits.proposals_max} per repository)"
        )
    elif not budget_allows(s, HubState.CONTEMPLATING):
        parts.append(f"no contemplation: {_budget_words(s, HubState.CONTEMPLATING)}")
    else:
        parts.append(_last(s, s.contemplated_at, "contemplation", s.limits.contemplate_every_s))
    return "resting: " + "; ".join(parts)


__all__ = [
    "Decision",
    "base_needs_healing",
    "bases_to_heal",
    "budget_allows",
    "cap_reached",
    "contemplation_due",
    "day_budget_spent",
    "decide",
    "has_failing_endpoints",
    "has_stuck_agents",
    "has_work",
    "idle",
    "may_contemplate",
    "may_execute",
    "may_improve",
    "needs_healing",
    "needs_wave",
    "proposals_full",
    "proposals_room",
    "proposals_waiting",
    "scan_due",
]
