"""The burst manager's events on `burst:events` (payloads typed: they cross into the UI)."""

from __future__ import annotations

from typing import Any, Literal

from annihilation.events import publish

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
