"""The wave page's reflection runs, redrawn live over the real ASGI application's websocket as a
run moves through its stages, and only for the wave on screen."""

from __future__ import annotations

import html as html_lib
import json
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from annihilation.asgi import application
from bursts.models import Burst, Wave
from reflection import extraction, pipeline
from reflection.models import ReflectionRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _page(user: User, wave_id: int) -> dict[str, Any]:
    """What the wave page tells static/live.js: its topics, page, params and catch-up point."""
    client = Client()
    client.force_login(user)
    body = client.get(f"/waves/{wave_id}/").content.decode()
    attrs = dict(re.findall(r'data-(topics|page|params|after)="([^"]*)"', body))
    return {
        "subscribe": json.loads(html_lib.unescape(attrs["topics"])),
        "page": attrs["page"],
        "params": json.loads(html_lib.unescape(attrs["params"])),
        "after": int(attrs["after"]),
    }


async def _connect(user: User, subscription: dict[str, Any]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost")]
    )
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to(subscription)
    return communicator


async def _messages(communicator: WebsocketCommunicator, n: int) -> list[dict[str, Any]]:
    return [await communicator.receive_json_from(timeout=5) for _ in range(n)]


def _status_shown(message: dict[str, Any], run_id: int) -> str:
    match = re.search(rf'id="wave-reflection-{run_id}" data-status="([a-z]+)"', message["html"])
    assert match, message
    return match.group(1)


def _world() -> tuple[User, Burst, Burst, Burst]:
    user = User.objects.create_user("watcher", password="pw")
    wave = Wave.objects.create()
    other = Wave.objects.create()
    return (
        user,
        Burst.objects.create(wave=wave, number=1),
        Burst.objects.create(wave=wave, number=2),
        Burst.objects.create(wave=other, number=1),
    )


async def test_the_wave_page_follows_a_reflection_through_its_stages(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    user, burst, second, elsewhere = await database_sync_to_async(_world)()
    subscription = await database_sync_to_async(_page)(user, burst.wave_id)
    assert subscription["page"] == "wave"
    assert {"burst:events", "reflection:started", "reflection:error"} <= set(
        subscription["subscribe"]
    )
    communicator = await _connect(user, subscription)
    step = database_sync_to_async

    run_id = await step(pipeline.start)(burst.pk)
    assert run_id is not None
    [started] = await _messages(communicator, 1)
    assert started["event"]["topic"] == "reflection:started"
    assert started["event"]["payload"]["wave"] == burst.wave_id
    assert 'id="wave-reflection" data-swap="replace"' in started["html"]
    assert _status_shown(started, run_id) == "started"

    await step(pipeline.extract)(run_id)  # extracting, then proposing
    extracting, proposing = await _messages(communicator, 2)
    assert [extracting["event"]["topic"], proposing["event"]["topic"]] == [
        "reflection:extracting",
        "reflection:proposing",
    ]
    assert _status_shown(proposing, run_id) == "proposing"

    # Another wave's reflection reaches the socket (same topic) but redraws nothing here.
    await step(pipeline.start)(elsewhere.pk)
    [foreign] = await _messages(communicator, 1)
    assert foreign["event"]["payload"]["wave"] == elsewhere.wave_id and "html" not in foreign

    for stage, topic in (
        (pipeline.propose, "reflection:evaluating"),
        (pipeline.evaluate, "reflection:curating"),
        (pipeline.curate, "reflection:completed"),
    ):
        await step(stage)(run_id)
        [message] = await _messages(communicator, 1)
        assert message["event"]["topic"] == topic
        assert _status_shown(message, run_id) == topic.split(":")[1]
    assert "burst&nbsp;1" in message["html"]

    # A stage that fails publishes only the run's id: the section finds its wave all the same.
    def broken(burst_id: int) -> Any:
        raise RuntimeError("diary unreadable")

    monkeypatch.setattr(extraction, "findings", broken)
    failing = await step(pipeline.start)(second.pk)
    assert failing is not None
    await _messages(communicator, 1)  # started
    await step(pipeline.extract)(failing)
    _extracting, error = await _messages(communicator, 2)
    assert error["event"]["topic"] == "reflection:error"
    assert "wave" not in error["event"]["payload"]
    assert _status_shown(error, failing) == "error"
    assert "extracting: RuntimeError: diary unreadable" in error["html"]
    assert _status_shown(error, run_id) == "completed"  # the whole section is redrawn
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_a_page_opened_late_catches_up_with_the_current_runs(redis_client: Any) -> None:
    user, burst, _second, _elsewhere = await database_sync_to_async(_world)()
    subscription = await database_sync_to_async(_page)(user, burst.wave_id)
    run, _cached = await database_sync_to_async(pipeline.reflect_burst)(burst.pk)
    assert run is not None
    communicator = await _connect(user, subscription)  # after= the page's render: 6 missed
    missed = await _messages(communicator, 6)
    assert [m["event"]["payload"]["status"] for m in missed] == [
        "started",
        "extracting",
        "proposing",
        "evaluating",
        "curating",
        "completed",
    ]
    assert all(_status_shown(m, run.pk) == "completed" for m in missed)  # drawn from the rows
    assert await database_sync_to_async(ReflectionRun.objects.count)() == 1
    await communicator.disconnect()
