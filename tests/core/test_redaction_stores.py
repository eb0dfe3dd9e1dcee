"""The table of secret shapes (tests/core/secret_shapes.py) through every store and every way out:
the event stream (its rows and what a live page receives over the websocket), a quantum filed
through the API (its row, the API's answers, the CLI and the pages, a user of no group too),
a change review's diff, an outgoing webhook's body, and the log. Each goes through one of the
redaction entry points (core.events.publish, quanta's clean_fields, the change review,
core.cli's TerminalOutput, the log record factory); none of the table's secrets survives."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from api.services import token_create
from core.access import operator_ensure
from core.events import publish
from core.redaction import redaction_reload
from hooks.models import WebhookDelivery, WebhookEndpoint
from hooks.services.endpoints import endpoint_save
from hooks.services.outgoing import delivery_attempt, outbox_scan
from psychonauts.workspaces.repository import branch_for
from quanta.models import Quantum
from tests.core.secret_shapes import ALL, SHAPES, leaked
from tests.hooks.conftest import receiver  # noqa: F401 - the webhook receiver fixture
from tether.services import change_review_create

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_rules() -> None:
    redaction_reload()


def database_text() -> str:
    """Every row of every table, as JSON text."""
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')
            rows += [row[0] for row in cursor.fetchall()]
    return "\n".join(rows)


def assert_clean(text: str, where: str) -> None:
    assert leaked(ALL), "the table itself holds the secrets"
    assert not leaked(text), f"{where} holds the secrets of {leaked(text)}"


def test_the_table_has_forty_shapes_or_more_and_each_is_redacted():
    from core.redaction import redact

    assert len(SHAPES) >= 40
    for shape in SHAPES:
        assert leaked(shape.text, (shape,)), shape.name
        assert not leaked(redact(shape.text), (shape,)), shape.name


def test_the_event_stream_stores_none():
    publish("quanta", "comment_added", {"body": ALL, "as_json": json.dumps({"env": ALL})})

    assert_clean(database_text(), "the events")


def test_a_quantum_filed_through_the_api_stores_and_shows_none(redis_client: Any):
    token = token_create(name="ci", scopes=["read", "operate"]).secret
    api = Client(headers={"Authorization": f"Bearer {token}"})

    created = api.post(
        "/api/quanta",
        json.dumps({"title": "Deploy " + SHAPES[0].text, "body": ALL, "acceptance": ALL}),
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    quantum_id = created.json()["id"]
    read = api.get(f"/api/quanta/{quantum_id}")

    assert_clean(created.content.decode() + read.content.decode(), "the API")
    assert_clean(database_text(), "the database")
    out = __import__("io").StringIO()
    call_command("quanta", "show", str(quantum_id), stdout=out)
    assert_clean(out.getvalue(), "the CLI")
    for user in (
        operator_ensure(username="op", password="pw-operator"),
        User.objects.create_user("nogroup", password="pw-nogroup"),  # a user of no group
    ):
        page = Client()
        page.force_login(user)
        shown = page.get(reverse("quantum", args=[quantum_id]))
        assert_clean(shown.content.decode(), f"the page as {user.username}")


def test_the_cli_prints_none_of_a_row_written_around_the_services():
    """A row an older version wrote, or the admin changed: the CLI's output redacts it."""
    quantum = Quantum.objects.create(title="Imported", body=ALL)
    out = __import__("io").StringIO()

    call_command("quanta", "show", str(quantum.pk), stdout=out)

    assert "…(redacted" in out.getvalue()
    assert_clean(out.getvalue(), "the CLI")


def test_a_change_reviews_diff_shows_none(repo: Path, tmp_path: Path):
    from bursts.models import Burst, QuantumRun, RunStatus, Wave

    quantum = Quantum.objects.create(title="Leaky change")
    branch = branch_for(quantum.pk)
    tree = tmp_path / "tree"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(
        [*git, "-C", str(repo), "worktree", "add", "-q", "-b", branch, str(tree)], check=True
    )
    (tree / "creds.env").write_text(ALL)
    subprocess.run([*git, "-C", str(tree), "add", "creds.env"], check=True)
    subprocess.run([*git, "-C", str(tree), "commit", "-q", "-m", "add creds"], check=True)
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE, branch=branch
    )

    review = change_review_create(quantum_run_id=run.pk)

    assert review is not None and "…(redacted" in review.diff
    assert_clean(review.diff, "the review's diff")
    assert_clean(database_text(), "the database")


def test_an_outgoing_webhooks_body_holds_none(receiver: Any, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    monkeypatch.setenv("STORES_HOOK_SECRET", "stores-hook-signing-secret-1")
    endpoint_save(
        endpoint=WebhookEndpoint(
            name="ops", url=receiver.url, secret_env="STORES_HOOK_SECRET", events=["wave.completed"]
        )
    )
    outbox_scan()
    publish("burst:events", "wave_completed", {"wave_id": 1, "status": "done", "note": ALL})
    outbox_scan()
    delivery = WebhookDelivery.objects.get()

    delivery_attempt(delivery_id=delivery.pk)

    assert_clean(delivery.body, "the delivery's body")
    assert_clean(receiver.wait(1)[0].body.decode(), "what the receiver got")


def test_the_log_holds_none(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO)

    logging.getLogger("annihilation.tests.stores").warning("agent said %s", ALL)
    logging.getLogger("annihilation.tests.stores").info({"env": ALL})

    assert caplog.records
    assert_clean(caplog.text, "the log")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_no_websocket_frame_holds_any(redis_client: object) -> None:
    await database_sync_to_async(publish)("agent:stores-1", "text", {"text": ALL})
    user = await database_sync_to_async(User.objects.create_user)("op", password="pw-for-tests")
    socket = WebsocketCommunicator(
        __import__("annihilation.asgi", fromlist=["application"]).application,
        "/ws/events/",
        headers=[(b"origin", b"http://localhost")],
    )
    socket.scope["user"] = user
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"subscribe": ["agent:stores-1"], "after": 0})
    frames = []
    while not await socket.receive_nothing(timeout=1.0):
        frames.append(await socket.receive_from())
    await socket.disconnect()

    decoded = "\n".join(json.dumps(json.loads(f), ensure_ascii=False) for f in frames)
    assert frames and "…(redacted" in decoded
    assert_clean("\n".join(frames) + decoded, "the websocket")
