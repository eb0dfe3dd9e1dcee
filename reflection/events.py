"""The reflection pipeline's events, on `reflection:<stage>`: their names (past tense), the
contract of every reader (the burst's reflection panel, the dashboard). Writers publish through
`reflection_event`, so mypy checks each name they spell."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from core.events import publish

ReflectionEventType = Literal[
    "reflection_stage_entered",  # the run moved to the stage its topic names
    "reflector_skipped",  # an entry the reflector refused, or a call that failed
]


def reflection_event(
    stage: str, event_type: ReflectionEventType, payload: Mapping[str, Any]
) -> None:
    """Record the event on `reflection:<stage>`; it goes live after the transaction commits."""
    publish(f"reflection:{stage}", event_type, payload)
