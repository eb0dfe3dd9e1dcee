"""The live event stream for the operator UI.

A client connects, then sends {"subscribe": [topics], "after": <last event id it saw>}. It joins
each topic's group and first receives every event it missed, so a reconnect loses nothing.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from annihilation.errors import UnknownTopic
from annihilation.events import ChannelEvent, check_topic, group_for_topic
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
        await self.accept()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
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
        for topic in topics:
            if topic not in self.topics:
                await self.channel_layer.group_add(group_for_topic(topic), self.channel_name)
                self.topics.append(topic)
        after = content.get("after")
        if isinstance(after, int):
            for message in await database_sync_to_async(events_after)(topics=topics, after=after):
                self.caught_up.add(message["id"])
                await self.send_json({"event": message})

    async def disconnect(self, code: int) -> None:
        for topic in getattr(self, "topics", []):
            await self.channel_layer.group_discard(group_for_topic(topic), self.channel_name)

    async def event_message(self, message: ChannelEvent) -> None:
        if message["event"]["id"] in self.caught_up:
            self.caught_up.discard(message["event"]["id"])
            return
        await self.send_json({"event": message["event"]})
