"""The autopilot's events, one topic per subject (`autopilot:<subject>`): their names (past tense),
the contract of every reader (the autopilot's pages, the dashboard). Writers publish through
the subject's function, so mypy checks each name they spell against its topic's list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from core.events import publish

HUB_TOPIC = "autopilot:hub"
GOALS_TOPIC = "autopilot:goals"
BUDGET_TOPIC = "autopilot:budget"
HEALING_TOPIC = "autopilot:healing"
SCAN_TOPIC = "autopilot:scan"
CONTEMPLATION_TOPIC = "autopilot:contemplation"

HubEventType = Literal["state_changed", "paused", "resumed", "forced", "wave_started"]
GoalEventType = Literal["goal_created", "goal_status_changed", "goal_plan_refused"]
# A run held before a call its budget refuses, then released, dropped or cancelled.
BudgetEventType = Literal["cap_reached", "run_held", "released", "dropped", "cancelled"]
HealingEventType = Literal[
    "agent_unstuck", "endpoint_marked_down", "base_checked", "healing_quantum_filed"
]
ScanEventType = Literal["started", "finished", "filed"]
ContemplationEventType = Literal["started"]

Payload = Mapping[str, Any]


def hub_event(event_type: HubEventType, payload: Payload) -> None:
    publish(HUB_TOPIC, event_type, payload)


def goal_event(event_type: GoalEventType, payload: Payload) -> None:
    publish(GOALS_TOPIC, event_type, payload)


def budget_event(event_type: BudgetEventType, payload: Payload) -> None:
    publish(BUDGET_TOPIC, event_type, payload)


def healing_event(event_type: HealingEventType, payload: Payload) -> None:
    publish(HEALING_TOPIC, event_type, payload)


def scan_event(event_type: ScanEventType, payload: Payload) -> None:
    publish(SCAN_TOPIC, event_type, payload)


def contemplation_event(event_type: ContemplationEventType, payload: Payload) -> None:
    publish(CONTEMPLATION_TOPIC, event_type, payload)
