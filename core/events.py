"""Publishing events: one durable row, then (after commit) a message to the topic's group.

The row is the truth; the live message is a courtesy, sent in order by a background thread. If
the channel layer is down, the send is logged and dropped, and clients catch up from the event
sequence when they reconnect.

Core knows topics, not event names: each app declares the names of its topics' events in its
own `events.py` and publishes through them (tests/test_event_names.py).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.errors import UnknownTopic
from core.models import Event
from core.redaction import redact_data
from core.sql import Statement

logger = logging.getLogger(__name__)

# The event topics: an agent's stream (`agent:<id>`), the Tether's queues, the burst manager's
# lifecycle, reflection's stages (`reflection:<stage>`), the autopilot's (`autopilot:<subject>`:
# hub, goals, budget, scan, healing), the quanta and the alerter's (`alerts`). Anything else is refused.
_TOPIC = re.compile(
    r"^(agent:[A-Za-z0-9_.-]{1,150}"
    r"|tether:(reaching|drifts|questions)"
    r"|burst:events"
    r"|reflection:[a-z_]{1,50}"
    r"|autopilot:[a-z_]{1,50}"
    r"|quanta"
    r"|alerts)$"
)


class EventMessage(TypedDict):
    id: int
    topic: str
    type: str
    payload: dict[str, Any]
    created_at: str
    session_id: int | None


class ChannelEvent(TypedDict):
    """What a consumer receives from the channel layer (`type` routes to its handler): the
    events of one topic published together, in order (one send for a step's several events)."""

    type: Literal["event.batch"]
    events: list[EventMessage]


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
    batch = EventBatch(topic, [(event_type, payload or {})], session_id)
    message = batch.record()[0]
    return Event(
        pk=message["id"],
        topic=topic,
        type=event_type,
        payload=message["payload"],
        session_id=session_id,
        created_at=batch.now,
    )


def publish_many(
    topic: str,
    items: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    session_id: int | None = None,
) -> list[EventMessage]:
    """`publish` for several events of one topic: one INSERT, one live send after commit.

    For a writer that publishes several events per step (an agent's turn): the rows go in with
    the step's checkpoint instead of one round trip each.
    """
    return EventBatch(topic, items, session_id).record() if items else []


class EventParams(TypedDict):
    """The parameters that carry a batch's events into a statement: `EventBatch.params()`.

    A writer whose step writes its events in the same statement (one round trip) spells the
    INSERT out in its own statement text, as `_EVENTS_RECORD` does here, and selects the new ids
    in the rows' order (`ARRAY(SELECT id FROM events ORDER BY id)`) for `EventBatch.sent`."""

    events: str  # a JSON array of {"type", "payload"}, redacted
    events_session: int | None
    events_topic: str
    events_now: datetime


_EVENTS_RECORD = Statement(
    "events_record",
    "A batch's events in their own statement; their ids in the rows' order.",
    EventParams,
    """
WITH events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    RETURNING id
)
SELECT ARRAY(SELECT id FROM events ORDER BY id)
""",
)


class EventBatch:
    """Events of one topic, written by one statement: their own (`record`), or a statement of
    the caller's that writes them with its step (`params`, then `sent` with the ids), so that a
    step of a hot path and its events are one round trip.

    One plain statement for one or many rows: the ORM's create / bulk_create cost several times
    more Python per row, and agents write events on every turn.
    """

    def __init__(
        self,
        topic: str,
        items: Sequence[tuple[str, Mapping[str, Any]]],
        session_id: int | None = None,
    ) -> None:
        check_topic(topic)
        self.topic, self.session_id, self.now = topic, session_id, timezone.now()
        # Every event passes here: what is stored and sent live is redacted, whoever published.
        self._json = json.dumps([{"type": t, "payload": redact_data(dict(p))} for t, p in items])

    def params(self) -> EventParams:
        return {
            "events": self._json,
            "events_session": self.session_id,
            "events_topic": self.topic,
            "events_now": self.now,
        }

    def sent(self, ids: Sequence[int]) -> list[EventMessage]:
        """The rows' messages (their payloads as a reader of the rows sees them), sent to the
        topic's live group once the transaction commits."""
        created = self.now.isoformat()
        messages: list[EventMessage] = [
            {
                "id": event_id,
                "topic": self.topic,
                "type": item["type"],
                "payload": item["payload"],
                "created_at": created,
                "session_id": self.session_id,
            }
            for event_id, item in zip(ids, json.loads(self._json), strict=True)
        ]
        if messages:
            _send_on_commit(messages)
        return messages

    def record(self) -> list[EventMessage]:
        (ids,) = _EVENTS_RECORD.row(self.params())
        return self.sent(ids)


def _send_on_commit(messages: list[EventMessage]) -> None:
    transaction.on_commit(lambda: _sender().submit(messages))


def run_later(job: Callable[[], Awaitable[None]]) -> None:
    """Run a coroutine on this process's live-events thread after what is queued there: for
    other fire-and-forget writes of hot state (a failure is logged and dropped)."""
    _sender().put(job)


def flush_live(timeout: float | None = None) -> bool:
    """Wait until every queued live send (and `run_later` job) is done; False if `timeout` ran
    out first."""
    sender = _LiveSender.current
    return sender is None or sender.flush(
        settings.EVENT_SEND_TIMEOUT_S if timeout is None else timeout
    )


class _LiveSender:
    """One event loop thread per process that sends live events to the channel layer in order.

    `async_to_sync(group_send)` per event is dear (a fresh loop and Redis connection each
    time) and blocks the publisher; agents publish many events per turn. Here publishing only
    enqueues; a single consumer coroutine sends in submission order over pooled connections.
    The loop is woken only when it is not already draining: a hundred agents' submissions
    during one send are taken by the same drain, not one wake-up (and GIL hand-off) each.
    At interpreter exit the queue is flushed (bounded by EVENT_SEND_TIMEOUT_S), so a short-lived
    command's last events still go out. A send that fails is logged and dropped: the rows are
    durable and clients catch up by sequence.
    """

    current: _LiveSender | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        # Coroutine jobs, and live sends (one topic's messages each).
        self.jobs: collections.deque[Callable[[], Awaitable[None]] | list[EventMessage]] = (
            collections.deque()
        )
        self.jobs_lock = threading.Lock()
        self.draining = False
        self.idle = threading.Event()  # set when no job is queued or running
        self.idle.set()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-events", daemon=True)
        self.thread.start()
        self.ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.layer = get_channel_layer()
        self.ready.set()
        self.loop.run_forever()

    def _start_drain(self) -> None:
        self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        while True:
            with self.jobs_lock:
                if not self.jobs:
                    self.draining = False
                    self.idle.set()
                    return
                jobs = list(self.jobs)
                self.jobs.clear()
            sends = {group_for_topic(job[0]["topic"]) for job in jobs if isinstance(job, list)}
            listened = await self._listened(sends) if sends else set()
            for job in jobs:
                try:
                    if not isinstance(job, list):
                        await job()
                    elif group_for_topic(job[0]["topic"]) in listened:
                        await self._send(job)
                except Exception:
                    logger.warning("live-events job %r failed", job, exc_info=True)

    async def _listened(self, groups: set[str]) -> set[str]:
        """The groups that have members, asked in one round trip per Redis: a group send costs
        two even to nobody, and an agent's group mostly has nobody (someone watching that one
        agent). A client joins before it catches up from the rows, so one joining after this
        check still gets the events. Any other layer, or a failed check: every group."""
        # Imported here, by a process that sends events, not by every process that loads core.
        from channels_redis.core import RedisChannelLayer

        layer = self.layer
        if not isinstance(layer, RedisChannelLayer):
            return groups
        try:
            by_connection: dict[int, list[str]] = collections.defaultdict(list)
            for group in groups:
                by_connection[layer.consistent_hash(group)].append(group)
            listened: set[str] = set()
            for index, members in by_connection.items():
                async with layer.connection(index).pipeline(transaction=False) as pipe:
                    for group in members:
                        pipe.exists(layer._group_key(group))
                    found = await pipe.execute()
                listened.update(g for g, n in zip(members, found, strict=True) if n)
            return listened
        except Exception:
            logger.warning("live-events: checking for listeners failed", exc_info=True)
            return groups

    async def _send(self, messages: list[EventMessage]) -> None:
        try:
            if self.layer is not None:
                channel_event: ChannelEvent = {"type": "event.batch", "events": messages}
                await self.layer.group_send(group_for_topic(messages[0]["topic"]), channel_event)
        except Exception:
            ids = [m["id"] for m in messages]
            logger.warning("live send failed for events %s", ids, exc_info=True)

    def submit(self, messages: list[EventMessage]) -> None:
        """Queue the events of one topic, sent together."""
        self.put(messages)

    def put(self, job: Callable[[], Awaitable[None]] | list[EventMessage]) -> None:
        with self.jobs_lock:
            self.jobs.append(job)
            self.idle.clear()
            if self.draining:
                return  # the running drain takes it
            self.draining = True
        self.loop.call_soon_threadsafe(self._start_drain)

    def flush(self, timeout: float) -> bool:
        return self.idle.wait(timeout)


def _sender() -> _LiveSender:
    sender = _LiveSender.current
    if sender is not None and sender.pid == os.getpid():
        return sender
    with _LiveSender._lock:
        # A forked child (prefork worker) inherits the object but not the thread: start anew.
        if _LiveSender.current is None or _LiveSender.current.pid != os.getpid():
            _LiveSender.current = _LiveSender()
        return _LiveSender.current


atexit.register(flush_live)
