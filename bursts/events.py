"""The burst manager's events on `burst:events` (payloads typed: they cross into the UI)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from core.events import EventBatch, publish, publish_many

TOPIC = "burst:events"

BurstEventType = Literal[
    "wave_start",
    "wave_complete",
    "wave_cancelled",
    "burst_start",
    "burst_complete",
    "run_complete",
    "run_drained",
    "stage_complete",
    "stage_redispatched",
]


def burst_event(event_type: BurstEventType, **payload: Any) -> None:
    """Record the event now; it goes live after the transaction commits."""
    publish(TOPIC, event_type, payload)


BurstEvent = tuple[BurstEventType, dict[str, Any]]


def burst_events(events: Sequence[BurstEvent]) -> None:
    """Several events of one step in one INSERT (a round trip each cost more than the step's
    own writes); they go live in order after the transaction commits."""
    if len(events) == 1:
        burst_event(events[0][0], **events[0][1])
    elif events:
        publish_many(TOPIC, events)


def burst_batch(events: Sequence[BurstEvent]) -> EventBatch:
    """Events of one step for a statement of the caller's that writes them with its own rows
    (`EventBatch.params`): the step and its events in one round trip."""
    return EventBatch(TOPIC, events)
