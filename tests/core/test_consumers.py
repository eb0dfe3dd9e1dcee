from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from annihilation.asgi import application
from annihilation.events import publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def connect(user):
    communicator = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost")]
    )
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    return communicator, connected


async def test_it_refuses_anonymous_users():
    _communicator, connected = await connect(AnonymousUser())
    assert not connected


async def test_it_catches_up_then_streams_live(redis_client):
    user = await database_sync_to_async(User.objects.create_user)("op", password="pw")
    missed = await database_sync_to_async(publish)("quanta", "quantum_created", {"quantum_id": 1})
    communicator, connected = await connect(user)  # its live copy may still be in flight
    assert connected
    await communicator.send_json_to({"subscribe": ["quanta"], "after": missed.pk - 1})
    caught_up = await communicator.receive_json_from(timeout=2)
    assert caught_up["event"]["id"] == missed.pk
    live = await database_sync_to_async(publish)("quanta", "quantum_closed", {"quantum_id": 1})
    message = await communicator.receive_json_from(timeout=2)
    assert message["event"]["id"] == live.pk and message["event"]["type"] == "quantum_closed"
    assert await communicator.receive_nothing(timeout=0.3)  # no duplicate of the caught-up one
    await communicator.disconnect()


async def test_it_rejects_unknown_topics(redis_client):
    user = await database_sync_to_async(User.objects.create_user)("op2", password="pw")
    communicator, _ = await connect(user)
    await communicator.send_json_to({"subscribe": ["secrets"]})
    reply = await communicator.receive_json_from(timeout=2)
    assert "unknown event topic" in reply["error"]
    await communicator.disconnect()
