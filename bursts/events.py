"""The burst manager's events on `burst:events`: their names and payloads, the contract of every
reader (the live pages, the webhooks, the reflection pipeline, the CLI)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TypedDict

from core.events import EventBatch, publish, publish_many

TOPIC = "burst:events"


class BurstEventType(StrEnum):
    """What happened to a wave, a burst, a quantum's run or a stage (past tense)."""

    WAVE_STARTED = "wave_started"
    WAVE_COMPLETED = "wave_completed"  # done or failed (its status says which)
    WAVE_CANCELLED = "wave_cancelled"
    BURST_STARTED = "burst_started"
    BURST_COMPLETED = "burst_completed"
    RUN_COMPLETED = "run_completed"
    RUN_DRAINED = "run_drained"
    STAGE_COMPLETED = "stage_completed"
    STAGE_REDISPATCHED = "stage_redispatched"


class WaveStarted(TypedDict):
    wave_id: int
    labels: list[str]
    continuous: bool
    max_bursts: int


class WaveEnded(TypedDict):
    """`wave_completed` and `wave_cancelled`."""

    wave_id: int
    status: str
    error: str
    stats: dict[str, Any]


class BurstRun(TypedDict):
    run_id: int
    quantum_id: int
    pipeline: str


class BurstStarted(TypedDict):
    wave_id: int
    burst_id: int
    number: int
    runs: list[BurstRun]


class BurstCompleted(TypedDict):
    wave_id: int
    burst_id: int
    number: int
    stats: dict[str, Any]


class RunCompleted(TypedDict):
    wave_id: int
    burst_id: int | None
    run_id: int
    quantum_id: int
    status: str
    pipeline: str
    reason: str


class RunDrained(TypedDict):
    wave_id: int
    run_id: int
    quantum_id: int
    status: str
    quantum_outcome: str


class StageCompleted(TypedDict):
    wave_id: int
    run_id: int
    quantum_id: int
    stage: int
    name: str
    status: str
    reason: str
    next_stage: str | None
    skipped: list[str]


class StageRedispatched(TypedDict):
    wave_id: int
    run_id: int
    stage: int
    positions: list[int]


BurstPayload = (
    WaveStarted
    | WaveEnded
    | BurstStarted
    | BurstCompleted
    | RunCompleted
    | RunDrained
    | StageCompleted
    | StageRedispatched
)
BurstEvent = tuple[BurstEventType, BurstPayload]


def burst_event(event_type: BurstEventType, payload: BurstPayload) -> None:
    """Record the event now; it goes live after the transaction commits."""
    publish(TOPIC, event_type, payload)


def burst_events(events: Sequence[BurstEvent]) -> None:
    """Several events of one step in one INSERT (a round trip each cost more than the step's
    own writes); they go live in order after the transaction commits."""
    if len(events) == 1:
        burst_event(*events[0])
    elif events:
        publish_many(TOPIC, events)


def burst_batch(events: Sequence[BurstEvent]) -> EventBatch:
    """Events of one step for a statement of the caller's that writes them with its own rows
    (`EventBatch.params`): the step and its events in one round trip."""
    return EventBatch(TOPIC, events)
