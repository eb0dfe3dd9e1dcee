"""The live event stream for the operator UI.

A client connects, then sends {"subscribe": [topics], "after": <last event id it saw>} and, for
a live page, "page" and "params". It joins each topic's group and first receives every event it
missed, so a reconnect loses nothing. Each event goes out as {"event": ..., "html": ...}, the
html being the page's server-rendered fragments for it (annihilation.live).

Actions ({"action": name, ...}) are for operators only: the permission is checked here, per
message, exactly as the action views check it.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from annihilation.access import user_can_operate
from annihilation.errors import UnknownTopic
from annihilation.events import ChannelEvent, EventMessage, check_topic, group_for_topic
from annihilation.live import ActionRefused, fragment_render, live_page_known, ws_action_get
from annihilation.selectors import events_after


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

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and isinstance(content.get("action"), str):
            await self.act(content)
            return
        topics = content.get("subscribe") if isinstance(content, dict) else None
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            await self.send_json({"error": "send {'subscribe': [topics], 'after': <event id>}"})
            return
        try:
            for topic in topics:
                check_topic(topic)
        except UnknownTopic as exc:
            await self.send_json({"error": str(exc)})
            return
        page, params = content.get("page"), content.get("params")
        if isinstance(page, str) and live_page_known(page):
            self.page = page
            if isinstance(params, dict):
                self.params = {str(k): str(v) for k, v in params.items()}
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
        name = content["action"]
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
            await self.send_json({"action": name, "ok": False, "error": str(exc)})
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
            html = await database_sync_to_async(fragment_render)(
                event, page=self.page, params=self.params, can_operate=self.can_operate
            )
        await self.send_json({"event": event, "html": html} if html else {"event": event})
