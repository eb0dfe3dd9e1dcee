"""Which events of the stream (core.events) are webhook events, and under which name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hooks.models import HookEvent

# (topic, type) as published -> the webhook event. The wave's end (bursts), a question for the
# operator (the Tether's reaching), a change review waiting for a decision, an alert (operations).
SOURCES: dict[tuple[str, str], HookEvent] = {
    ("burst:events", "wave_complete"): HookEvent.WAVE_COMPLETE,
    ("tether:reaching", "question_asked"): HookEvent.REACHING_CREATED,
    ("tether:drifts", "change_review_created"): HookEvent.CHANGE_PENDING,
    ("alerts", "alert_firing"): HookEvent.ALERT_FIRING,
}

TOPICS: tuple[str, ...] = tuple(sorted({topic for topic, _ in SOURCES}))


def hook_event_for(topic: str, event_type: str, payload: Mapping[str, Any]) -> HookEvent | None:
    """The webhook event an event of the stream is, or None. A change review created already
    decided (merged at once by the auto-merge rule) is not pending."""
    found = SOURCES.get((topic, event_type))
    if found is HookEvent.CHANGE_PENDING and payload.get("status", "pending") != "pending":
        return None
    return found
