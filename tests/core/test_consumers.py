from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from annihilation.asgi import application
from core.events import publish

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


async def test_it_pushes_the_pages_fragments_on_catch_up_and_live(redis_client):
    from bursts.models import AgentRun
    from tests.factories import make_quantum

    user = await database_sync_to_async(User.objects.create_user)("op3", password="pw")
    quantum = await database_sync_to_async(make_quantum)("focus me")
    run = await database_sync_to_async(AgentRun.objects.create)(
        agent_id=f"{quantum.pk}_s0_coder", quantum=quantum, role="coder"
    )
    topic = f"agent:{run.agent_id}"
    missed = await database_sync_to_async(publish)(
        topic, "text", {"agent_run_id": run.pk, "text": "<b>missed</b>"}
    )
    communicator, _ = await connect(user)
    await communicator.send_json_to(
        {
            "subscribe": [topic],
            "after": missed.pk - 1,
            "page": "focus",
            "params": {"agent_run_id": run.pk},
        }
    )
    caught_up = await communicator.receive_json_from(timeout=2)
    assert caught_up["event"]["id"] == missed.pk
    assert (
        f'id="st-{missed.pk}"' in caught_up["html"]
        and 'data-swap="append:stream"' in caught_up["html"]
    )
    assert "&lt;b&gt;missed&lt;/b&gt;" in caught_up["html"]  # escaped: payloads are not HTML
    other_attempt = await database_sync_to_async(publish)(
        topic, "text", {"agent_run_id": run.pk + 1000, "text": "not this attempt"}
    )
    live = await database_sync_to_async(publish)(
        topic, "tool_call", {"agent_run_id": run.pk, "id": "t1", "name": "shell", "input": {}}
    )
    first = await communicator.receive_json_from(timeout=2)
    assert first["event"]["id"] == other_attempt.pk and "html" not in first
    second = await communicator.receive_json_from(timeout=2)
    assert second["event"]["id"] == live.pk and "shell" in second["html"]
    await communicator.disconnect()


async def test_a_viewer_cannot_act_over_the_socket_and_an_operator_can(redis_client):
    from bursts.models import Wave
    from core.access import operator_ensure, viewer_ensure

    viewer = await database_sync_to_async(viewer_ensure)(username="v", password="pw")
    operator = await database_sync_to_async(operator_ensure)(username="o", password="pw")
    wave = await database_sync_to_async(Wave.objects.create)()
    communicator, _ = await connect(viewer)
    await communicator.send_json_to({"action": "wave_cancel", "wave_id": wave.pk})
    reply = await communicator.receive_json_from(timeout=2)
    assert reply == {"action": "wave_cancel", "ok": False, "error": "forbidden"}
    await communicator.disconnect()
    assert (await database_sync_to_async(Wave.objects.get)(pk=wave.pk)).status == "running"

    communicator, _ = await connect(operator)
    await communicator.send_json_to({"action": "wave_cancel", "wave_id": wave.pk})
    reply = await communicator.receive_json_from(timeout=2)
    assert reply["ok"] and reply["status"] == "cancelled"
    await communicator.send_json_to({"action": "wave_cancel", "wave_id": wave.pk})
    stale = await communicator.receive_json_from(timeout=2)
    assert not stale["ok"] and "nothing to cancel" in stale["error"]
    await communicator.disconnect()


@pytest.mark.slow
async def test_an_idle_live_page_stays_connected_and_still_receives(redis_client, caplog):
    """A live page may see no event for minutes: the consumer's channel layer read must outlast
    its Redis socket timeout (longer than 5 s, the blocking read, many times over here)."""
    user = await database_sync_to_async(User.objects.create_user)("idle", password="pw")
    communicator, connected = await connect(user)
    assert connected
    await communicator.send_json_to({"subscribe": ["quanta"], "page": "dashboard"})
    with caplog.at_level(logging.ERROR):
        await asyncio.sleep(32)
        assert not communicator.future.done()  # the consumer is still running
        assert await communicator.receive_nothing(timeout=0.1)  # and closed nothing
        event = await database_sync_to_async(publish)(
            "quanta", "quantum_created", {"quantum_id": 7}
        )
        message = await communicator.receive_json_from(timeout=5)
    assert message["event"]["id"] == event.pk
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    await communicator.disconnect()


async def test_a_frame_it_cannot_use_gets_an_error_frame_naming_the_field(redis_client):
    from core.access import operator_ensure

    operator = await database_sync_to_async(operator_ensure)(username="o2", password="pw")
    communicator, _ = await connect(operator)
    frames: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"bytes": b"\x00\x01"}, {"field": "frame", "error": "send JSON text frames, not binary ones"}),
        ({"text": "{"}, {"field": "frame", "error": "not valid JSON"}),
        ({"text": "[" * 60_000}, {"field": "frame", "error": "not valid JSON"}),
        ({"text": " " * 70_000}, {"field": "frame", "error": "larger than 65,536 characters"}),
        ({"text": "[1]"}, {"field": "frame", "error": "send a JSON object"}),
        ({"text": '{"action": "reaching_answer", "reaching_id": 1, "text": "a\\u0000"}'}, {"field": "text", "error": "text contains a NUL character"}),
        ({"text": '{"subscribe": ["quanta"], "page": "\\ud800"}'}, {"field": "page", "error": "page is not valid UTF-8"}),
        ({"text": '{"subscribe": "quanta"}'}, {"field": "subscribe", "error": "send {'subscribe': [topics], 'after': <event id>}"}),
    ]  # fmt: skip
    for frame, reply in frames:
        await communicator.send_input({"type": "websocket.receive", **frame})
        assert await communicator.receive_json_from(timeout=2) == {"type": "error", **reply}
    await communicator.send_json_to({"action": "wave_cancel", "wave_id": 2**70})
    assert await communicator.receive_json_from(timeout=2) == {
        "type": "error",
        "field": "wave_id",
        "error": "wave_id must be an id (1 or more, below 2**63)",
        "action": "wave_cancel",
        "ok": False,
    }
    await communicator.disconnect()
