"""Which events of the stream (core.events) are webhook events, and under which name. The stream's
names come from the apps that publish them: a rename there is a rename here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bursts.events import TOPIC as BURSTS_TOPIC
from bursts.events import BurstEventType
from hooks.models import HookEvent
from operations.events import ALERTS_TOPIC, AlertEventType
from tether.events import CHANGES_TOPIC, REACHINGS_TOPIC, TetherEventType

# (topic, type) as published -> the webhook event. The wave's end (bursts), a question for the
# operator (the Tether's reaching), a change review waiting for a decision, an alert (operations).
SOURCES: dict[tuple[str, str], HookEvent] = {
    (BURSTS_TOPIC, BurstEventType.WAVE_COMPLETED): HookEvent.WAVE_COMPLETED,
    (REACHINGS_TOPIC, TetherEventType.QUESTION_ASKED): HookEvent.REACHING_CREATED,
    (CHANGES_TOPIC, TetherEventType.CHANGE_REVIEW_CREATED): HookEvent.CHANGE_SUBMITTED,
    (ALERTS_TOPIC, AlertEventType.ALERT_FIRED): HookEvent.ALERT_FIRED,
    # The names these events had in rows written by an earlier release: the outbox may still
    # read such rows after an upgrade (the stream is append-only; its rows keep their names).
    (BURSTS_TOPIC, "wave_complete"): HookEvent.WAVE_COMPLETED,
    (ALERTS_TOPIC, "alert_firing"): HookEvent.ALERT_FIRED,
}

TOPICS: tuple[str, ...] = tuple(sorted({topic for topic, _ in SOURCES}))


def hook_event_for(topic: str, event_type: str, payload: Mapping[str, Any]) -> HookEvent | None:
    """The webhook event an event of the stream is, or None. A change review created already
    decided (merged at once by the auto-merge rule) is not waiting for a decision."""
    found = SOURCES.get((topic, event_type))
    if found is HookEvent.CHANGE_SUBMITTED and payload.get("status", "pending") != "pending":
        return None
    return found
