"""The events on the `quanta` topic: their names (past tense, or a record's noun), the contract
of every reader (the quanta pages, the dashboard, the CLI). Writers publish through
`quanta_event`, so mypy checks each name they spell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from core.events import publish, publish_many

TOPIC = "quanta"

QuantaEventType = Literal[
    "quantum_created",
    "quantum_updated",
    "quantum_closed",
    "quantum_reopened",
    "quantum_deferred",
    "quantum_released",
    "dependency_added",
    "dependency_removed",
    "comment_added",
    "quanta_imported",
    "pipeline_created",
    "pipeline_updated",
    # A record: a round of a quantum's verify commands on an agent's commit (psychonauts).
    "verification",
]


def quanta_event(event_type: QuantaEventType, payload: Mapping[str, Any]) -> None:
    """Record the event now; it goes live after the transaction commits."""
    publish(TOPIC, event_type, payload)


def quanta_events(events: Sequence[tuple[QuantaEventType, Mapping[str, Any]]]) -> None:
    """Several events in one INSERT."""
    publish_many(TOPIC, events)
