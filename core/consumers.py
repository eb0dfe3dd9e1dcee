"""The live event stream for the operator UI.

A client connects, then sends {"subscribe": [topics], "after": <last event id it saw>} and, for
a live page, "page" and "params". It joins each topic's group and first receives every event it
missed, so a reconnect loses nothing. Each event goes out as {"event": ..., "html": ...}, the
html being the page's server-rendered fragments for it (core.live).

Actions ({"action": name, ...}) are for operators only: the permission is checked here, per
message, exactly as the action views check it.

A frame the consumer cannot use (not JSON, binary, too large, a NUL in a value, a wrong type)
gets an error frame {"type": "error", "field": ..., "error": ...} and the socket stays open.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal, NotRequired, TypedDict

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core.access import user_can_operate
from core.errors import UnknownTopic
from core.events import ChannelEvent, EventMessage, check_topic, group_for_topic
from core.live import ActionRefused, fragment_render, live_page_known, ws_action_get
from core.safetext import quoted, text_problem
from core.safeyaml import MAX_DEPTH
from core.selectors import events_after

logger = logging.getLogger(__name__)

FRAME_MAX = 64 * 1024  # characters of one incoming frame; a page's messages are far smaller
TOPICS_MAX = 50  # topics one socket may follow
PARAM_MAX = 200  # characters of a page parameter
NAME_MAX = 100  # characters of an action name echoed back


class ErrorFrame(TypedDict):
    type: Literal["error"]
    field: str
    error: str
    action: NotRequired[str]
    ok: NotRequired[bool]


def _error(field: str, error: str) -> ErrorFrame:
    return {"type": "error", "field": field, "error": error}


def _bad_value(value: Any, depth: int = 0) -> str | None:
    """Why a decoded value cannot be used (a NUL, bytes that are not UTF-8, deep nesting)."""
    if depth > MAX_DEPTH:
        return "is nested too deeply"
    if isinstance(value, str):
        return text_problem(value)
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        problem = (text_problem(key) if isinstance(key, str) else None) or _bad_value(
            item, depth + 1
        )
        if problem is not None:
            return problem
    return None


class EventConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    groups: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.topics: list[str] = []
        # Ids sent by the catch-up: their live copies may still be in flight, and are dropped.
        # (Not "everything below the highest id": a lower id can commit after a higher one.)
        self.caught_up: set[int] = set()
        self.page = ""
        self.params: dict[str, str] = {}
        self.can_operate = await database_sync_to_async(user_can_operate)(user)
        await self.accept()

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if text_data is None:
            await self.send_json(_error("frame", "send JSON text frames, not binary ones"))
            return
        if len(text_data) > FRAME_MAX:
            await self.send_json(_error("frame", f"larger than {FRAME_MAX:,} characters"))
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's stack
            await self.send_json(_error("frame", "not valid JSON"))
            return
        if not isinstance(content, dict):
            await self.send_json(_error("frame", "send a JSON object"))
            return
        for key, value in content.items():
            problem = _bad_value(value) or text_problem(key)
            if problem is not None:
                field = key if 0 < len(key) <= NAME_MAX and key.isprintable() else quoted(key)
                await self.send_json(_error(field, f"{field} {problem}"))
                return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and isinstance(content.get("action"), str):
            await self.act(content)
            return
        topics = content.get("subscribe") if isinstance(content, dict) else None
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            await self.send_json(
                _error("subscribe", "send {'subscribe': [topics], 'after': <event id>}")
            )
            return
        if len(topics) > TOPICS_MAX:
            await self.send_json(_error("subscribe", f"at most {TOPICS_MAX} topics"))
            return
        try:
            for topic in topics:
                check_topic(topic)
        except UnknownTopic as exc:
            await self.send_json(_error("subscribe", str(exc)))
            return
        page, params = content.get("page"), content.get("params")
        if isinstance(page, str) and live_page_known(page):
            self.page = page
            if isinstance(params, dict):
                self.params = {
                    str(k)[:PARAM_MAX]: str(v)[:PARAM_MAX] for k, v in list(params.items())[:20]
                }
        for topic in topics:
            if topic not in self.topics:
                await self.channel_layer.group_add(group_for_topic(topic), self.channel_name)
                self.topics.append(topic)
        after = content.get("after")
        if isinstance(after, int):
            for message in await database_sync_to_async(events_after)(topics=topics, after=after):
                self.caught_up.add(message["id"])
                await self.send_event(message)

    async def act(self, content: dict[str, Any]) -> None:
        name = content["action"][:NAME_MAX]
        user = self.scope["user"]
        # Checked on every message, not only at connect: a demoted operator stops at once.
        if not await database_sync_to_async(user_can_operate)(user):
            await self.send_json({"action": name, "ok": False, "error": "forbidden"})
            return
        action = ws_action_get(name)
        if action is None:
            await self.send_json({"action": name, "ok": False, "error": "unknown action"})
            return
        try:
            reply = await database_sync_to_async(action)(user, content)
        except ActionRefused as exc:
            if exc.field:
                frame = _error(exc.field, str(exc))
                await self.send_json({**frame, "action": name, "ok": False})
            else:
                await self.send_json({"action": name, "ok": False, "error": str(exc)})
            return
        except Exception:
            # A bug, not the operator's input: logged with its traceback, the socket stays.
            logger.exception("websocket action %s failed", name)
            frame = _error("action", "the action failed; the server log has the details")
            await self.send_json({**frame, "action": name, "ok": False})
            return
        await self.send_json({"action": name, "ok": True, **reply})

    async def disconnect(self, code: int) -> None:
        for topic in getattr(self, "topics", []):
            await self.channel_layer.group_discard(group_for_topic(topic), self.channel_name)

    async def event_batch(self, message: ChannelEvent) -> None:
        for event in message["events"]:
            if event["id"] in self.caught_up:
                self.caught_up.discard(event["id"])
                continue
            await self.send_event(event)

    async def send_event(self, event: EventMessage) -> None:
        html = ""
        if self.page:
            try:
                html = await database_sync_to_async(fragment_render)(
                    event, page=self.page, params=self.params, can_operate=self.can_operate
                )
            except Exception:
                # The page's parameters came from the client: whatever they break, the event
                # still goes out (without fragments) and the socket stays.
                logger.exception("live fragments of %s for page %s failed", event["id"], self.page)
        await self.send_json({"event": event, "html": html} if html else {"event": event})
