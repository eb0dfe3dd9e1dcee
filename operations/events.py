"""The alerter's events on `alerts`: their names and payload (outgoing webhooks deliver them)."""

from __future__ import annotations

from enum import StrEnum
from typing import TypedDict

ALERTS_TOPIC = "alerts"


class AlertEventType(StrEnum):
    """An alert rule's transition (past tense)."""

    ALERT_FIRED = "alert_fired"
    ALERT_RESOLVED = "alert_resolved"


class AlertPayload(TypedDict):
    rule: str
    status: str
    value: float
    threshold: float
    message: str
    fired_at: str
    resolved_at: str | None
    fire_count: int
