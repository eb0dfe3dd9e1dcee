"""The autopilot's rows as plain data: what `manage.py goals` and `manage.py autopilot` print
with --json."""

from __future__ import annotations

from typing import Any

from autopilot.goal_selectors import GoalChild
from autopilot.models import GoalTransition, HubTransition
from autopilot.selectors import GoalPage, GoalRow, HubStatus


def goal_data(row: GoalRow) -> dict[str, Any]:
    g = row.goal
    return {
        "id": g.pk,
        "title": g.title,
        "status": g.status,
        "reason": g.reason,
        "priority": g.priority,
        "source": g.source,
        "description": g.description,
        "success_criteria": g.success_criteria,
        "verify_commands": list(g.verify_commands),
        "labels": list(g.labels),
        "budget_usd": g.budget_usd,
        "spend_usd": row.spend_usd,
        "quanta_closed": row.closed,
        "quanta_total": row.total,
        "epic_id": g.epic_id,
        "plan_tries": g.plan_tries,
        "created_by": g.created_by,
        "approved_by": g.approved_by,
        "created_at": g.created_at,
        "updated_at": g.updated_at,
        "finished_at": g.finished_at,
    }


def goal_transition_data(t: GoalTransition) -> dict[str, Any]:
    return {
        "from": t.from_status,
        "to": t.to_status,
        "reason": t.reason,
        "by": t.by,
        "at": t.created_at,
    }


def goal_child_data(c: GoalChild) -> dict[str, Any]:
    return {
        "id": c.quantum_id,
        "title": c.title,
        "status": c.status,
        "priority": c.priority,
        "complexity": c.complexity,
        "waits_on": list(c.waits_on),
        "change": None if c.change_id is None else {"id": c.change_id, "status": c.change_status},
    }


def goal_page_data(d: GoalPage) -> dict[str, Any]:
    return {
        **goal_data(d.row),
        "history": [goal_transition_data(t) for t in d.transitions],
        "quanta": [goal_child_data(c) for c in d.children],
        "planner_runs": [
            {
                "id": r.pk,
                "agent_id": r.agent_id,
                "attempt": r.attempt,
                "role": r.role,
                "status": r.status,
                "cost_usd": r.cost_usd,
                "error": r.error,
                "created_at": r.created_at,
                "finished_at": r.finished_at,
            }
            for r in d.planner_runs
        ],
        "last_verify": None if d.last_verify is None else goal_transition_data(d.last_verify),
        "agents": dict(d.agents),  # what the agents of its epic and quanta spent
    }


def hub_transition_data(t: HubTransition) -> dict[str, Any]:
    return {
        "id": t.pk,
        "from": t.from_state,
        "to": t.to_state,
        "reason": t.reason,
        "by": t.by,
        "at": t.created_at,
    }


def hub_status_data(s: HubStatus) -> dict[str, Any]:
    h = s.hub
    return {
        "state": h.state,
        "reason": h.reason,
        "since": h.since,
        "paused": h.paused,
        "paused_reason": h.paused_reason if h.paused else "",
        "forced": h.forced,
        "tick_at": h.tick_at,
        "cap": {
            "cap_usd": s.cap.cap_usd,
            "spent_usd": s.cap.spent_usd,
            "reached": s.cap.reached,
        },
        "spend_today": {
            sp.scope: {
                "spent_usd": sp.spent_usd,
                "budget_usd": sp.budget_usd,
                "left_usd": sp.left_usd,
            }
            for sp in s.spend
        },
        "autopilot_spent_today_usd": s.spent_autopilot_usd,
        "autopilot_day_budget_usd": s.day_budget_usd,
        "transitions": [hub_transition_data(t) for t in s.transitions],
    }
