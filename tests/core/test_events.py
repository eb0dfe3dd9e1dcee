from __future__ import annotations

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import DatabaseError, transaction

from core.errors import UnknownTopic
from core.events import group_for_topic, publish, publish_many
from core.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


async def _subscribe(topic: str):
    """A fresh channel layer (bound to this test's loop) and a channel in the topic's group."""
    layer = RedisChannelLayer(hosts=[settings.REDIS_URL])
    channel = await layer.new_channel()
    await layer.group_add(group_for_topic(topic), channel)
    return layer, channel


async def _receive(layer, channel, timeout: float):
    try:
        return await asyncio.wait_for(layer.receive(channel), timeout)
    except TimeoutError:
        return None


async def test_it_sends_the_event_after_commit(redis_client):
    layer, channel = await _subscribe("agent:42_s0_coder")
    published, release = threading.Event(), threading.Event()

    def work():
        with transaction.atomic():
            event = publish("agent:42_s0_coder", "phase", {"phase": "thinking"})
            published.set()
            release.wait(5)
        return event

    pending = asyncio.ensure_future(database_sync_to_async(work)())
    await asyncio.get_running_loop().run_in_executor(None, published.wait, 5)
    assert await _receive(layer, channel, 0.3) is None  # published, not yet committed
    release.set()
    event = await pending
    message = await _receive(layer, channel, 2)
    assert message["type"] == "event.batch"
    assert [e["id"] for e in message["events"]] == [event.pk]
    assert message["events"][0]["payload"] == {"phase": "thinking"}


async def test_it_publishes_many_events_in_one_insert_and_sends_them_together(redis_client):
    layer, channel = await _subscribe("agent:7_s1_coder")

    def work():
        with transaction.atomic():
            return publish_many(
                "agent:7_s1_coder",
                [("usage", {"tokens_in": 3}), ("phase", {"phase": "tool_use"}), ("tool_call", {})],
                session_id=None,
            )

    published = await database_sync_to_async(work)()
    ids = [m["id"] for m in published]
    assert ids == sorted(ids) and all(ids)
    message = await _receive(layer, channel, 2)
    assert [e["id"] for e in message["events"]] == ids
    assert [e["type"] for e in message["events"]] == ["usage", "phase", "tool_call"]
    rows = await database_sync_to_async(
        lambda: list(Event.objects.filter(pk__in=ids).order_by("pk").values("type", "payload"))
    )()
    assert rows == [
        {"type": "usage", "payload": {"tokens_in": 3}},
        {"type": "phase", "payload": {"phase": "tool_use"}},
        {"type": "tool_call", "payload": {}},
    ]
    assert message["events"][0]["payload"] == {"tokens_in": 3}
    assert message["events"][0]["created_at"]


def test_publish_many_refuses_unknown_topics():
    with pytest.raises(UnknownTopic):
        publish_many("nope", [("x", {})])
    assert Event.objects.count() == 0


async def test_it_sends_nothing_and_keeps_nothing_on_rollback(redis_client):
    layer, channel = await _subscribe("burst:events")

    def work():
        with pytest.raises(RuntimeError), transaction.atomic():
            publish("burst:events", "burst_started", {"burst": 1})
            raise RuntimeError("boom")

    await database_sync_to_async(work)()
    assert await _receive(layer, channel, 0.5) is None
    assert await database_sync_to_async(Event.objects.count)() == 0


def test_it_refuses_unknown_topics():
    with pytest.raises(UnknownTopic):
        publish("nonsense", "x", {})
    with pytest.raises(UnknownTopic):
        publish("agent:bad id with spaces", "x", {})


def test_events_are_append_only():
    event = publish("quanta", "quantum_created", {"quantum_id": 1})
    with pytest.raises(DatabaseError, match="append-only"):
        Event.objects.filter(pk=event.pk).update(type="tampered")


def test_events_are_full_text_searchable():
    from django.contrib.postgres.search import SearchQuery

    publish("quanta", "comment_added", {"text": "the migrations were failing"})
    publish("quanta", "comment_added", {"text": "all good"})
    found = Event.objects.filter(search=SearchQuery("migration", config="english"))
    assert [e.payload["text"] for e in found] == ["the migrations were failing"]


async def test_live_sends_keep_publication_order(redis_client):
    from core.events import flush_live

    layer, channel = await _subscribe("agent:order_s0_coder")

    def work():
        for n in range(50):
            with transaction.atomic():
                publish("agent:order_s0_coder", "text", {"n": n})
        return flush_live(timeout=5)

    assert await database_sync_to_async(work)()
    received = [(await _receive(layer, channel, 2))["events"][0]["payload"]["n"] for _ in range(50)]
    assert received == list(range(50))


def test_live_sends_go_only_to_groups_someone_listens_to(redis_client):
    from asgiref.sync import async_to_sync

    from core.events import _sender

    listened, alone = "agent:1_s0_watched", "agent:2_s0_alone"
    layer = RedisChannelLayer(hosts=[settings.REDIS_URL])
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group_for_topic(listened), channel)
    sender = _sender()

    groups = {group_for_topic(listened), group_for_topic(alone)}
    found = asyncio.run_coroutine_threadsafe(sender._listened(groups), sender.loop).result(5)

    assert found == {group_for_topic(listened)}
