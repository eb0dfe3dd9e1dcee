"""An agent's events on its topic `agent:<agent id>`: their names, the contract of every reader
(the Focus page's stream and redraws, the terminal of `manage.py psychonaut`, the reflection
pipeline's transcripts). mypy checks each name a writer or a reader spells against this list.

Three kinds of name: what happened, in the past tense (`started`, `committed`,
`verification_started`); a record the run produced, a noun (`text`, `tool_call`, `usage`,
`verdict`); the status an execution ended in (`done`, `error`, `cancelled`, `waiting`,
`stale`), named as the run's status is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

from bursts.events import TOPIC as BURSTS_TOPIC
from core.events import publish

AgentEventType = Literal[
    # what happened
    "started",
    "routed",
    "restarted",
    "restored",
    "set_aside",
    "context_trimmed",
    "workspace_cleaned",
    "committed",
    "verification_started",
    "verdict_reminded",
    "cli_started",
    "cli_session_started",
    # records
    "phase",
    "text",
    "tool_call",
    "tool_result",
    "usage",
    "verification",
    "verdict",
    "cli_result",
    "cli_error",
    # the status an execution ended in
    "done",
    "error",
    "cancelled",
    "waiting",
    "stale",
]
AGENT_EVENT_TYPES: frozenset[str] = frozenset(get_args(AgentEventType))


def agent_event_type(name: str) -> AgentEventType | None:
    """A stored or received event's type as one of the names above (None for another: a name
    rows written by an earlier release may carry); a reader that compares it is checked."""
    return cast(AgentEventType, name) if name in AGENT_EVENT_TYPES else None


def agent_topic(agent_id: str) -> str:
    return f"agent:{agent_id}"


def agent_event(agent_id: str, event_type: AgentEventType, payload: Mapping[str, Any]) -> None:
    """One event on the agent's topic outside its runner (which buffers its own, `Runner.emit`)."""
    publish(agent_topic(agent_id), event_type, payload)


# A repository's environment, on the burst manager's topic (the operator's dashboard lists it):
# a build's end, and each connection its proxy refused (a build's, or an agent's).
EnvironmentEventType = Literal[
    "environment_built", "environment_failed", "environment_denied", "agent_network_denied"
]


def environment_event(event_type: EnvironmentEventType, payload: Mapping[str, Any]) -> None:
    publish(BURSTS_TOPIC, event_type, payload)
