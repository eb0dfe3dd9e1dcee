"""Publishing events: one durable row, then (after commit) a message to the topic's group.

The row is the truth; the live message is a courtesy. If the channel layer is down, the send is
logged and dropped, and clients catch up from the event sequence when they reconnect.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from annihilation.errors import UnknownTopic
from annihilation.models import Event

logger = logging.getLogger(__name__)

# The topics of DESIGN.md. `agent:<id>` and `reflection:<stage>` carry a suffix.
_TOPIC = re.compile(
    r"^(agent:[A-Za-z0-9_.-]{1,150}"
    r"|tether:(reaching|drifts|questions)"
    r"|burst:events"
    r"|reflection:[a-z_]{1,50}"
    r"|quanta)$"
)


class EventMessage(TypedDict):
    id: int
    topic: str
    type: str
    payload: dict[str, Any]
    created_at: str
    session_id: int | None


class ChannelEvent(TypedDict):
    """What a consumer receives from the channel layer (`type` routes to its handler)."""

    type: Literal["event.message"]
    event: EventMessage


def check_topic(topic: str) -> None:
    if not _TOPIC.match(topic):
        raise UnknownTopic(f"unknown event topic {topic!r}")


def group_for_topic(topic: str) -> str:
    """Channels group names allow only [A-Za-z0-9._-]: `agent:42_s0_coder` -> `agent.42_s0_coder`."""
    return topic.replace(":", ".")


def event_message(event: Event) -> EventMessage:
    return {
        "id": event.pk,
        "topic": event.topic,
        "type": event.type,
        "payload": event.payload,
        "created_at": event.created_at.isoformat(),
        "session_id": event.session_id,
    }


def publish(
    topic: str,
    event_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    session_id: int | None = None,
) -> Event:
    """Record an event and send it to the topic's live group once the transaction commits.

    Inside an atomic block that rolls back, neither the row nor the message survives.
    """
    check_topic(topic)
    event = Event.objects.create(
        topic=topic, type=event_type, payload=dict(payload or {}), session_id=session_id
    )
    message = event_message(event)
    transaction.on_commit(lambda: send_live_unsafe(message))
    return event


def send_live_unsafe(message: EventMessage) -> None:
    """Send now, whatever the transaction state (hence `unsafe`): only call after commit."""
    layer = get_channel_layer()
    if layer is None:
        return
    channel_event: ChannelEvent = {"type": "event.message", "event": message}
    try:
        async_to_sync(layer.group_send)(group_for_topic(message["topic"]), channel_event)
    except Exception:
        # The row is durable; a client that missed this catches up by sequence.
        logger.warning("live send failed for event %s", message["id"], exc_info=True)
