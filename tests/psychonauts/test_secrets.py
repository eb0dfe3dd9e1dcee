"""An agent that writes, reads back, says and notes secrets: its commit keeps them, nothing the
system stores, publishes, logs or prints does."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from annihilation.asgi import application
from bursts.models import AgentRun, Burst, QuantumRun, RunStatus, Wave
from core.access import operator_ensure
from core.selectors import events_after
from psychonauts.focus import worktree_diff
from psychonauts.models import DiaryEntry, ToolCall
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.repository import branch_for
from quanta.models import Quantum
from tests.core.secret_shapes import ALL, leaked
from tests.core.test_redaction import ANTHROPIC, AWS_ID, AWS_SECRET, GITHUB, KEY_BODY, SSH_KEY
from tether.models import Risk
from tether.services import change_review_create

pytestmark = pytest.mark.django_db

SECRETS = (AWS_ID, AWS_SECRET, GITHUB, ANTHROPIC, *KEY_BODY)
# The file and the agent's words carry the whole table of shapes (tests/core/secret_shapes.py).
FILE = (
    f"AWS_ACCESS_KEY_ID={AWS_ID}\n"
    f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n"
    f"GITHUB_TOKEN={GITHUB}\n"
    f'anthropic = "{ANTHROPIC}"\n' + SSH_KEY + ALL
)

SAID = (
    f"The id is {AWS_ID}, its secret {AWS_SECRET}.\n"
    f"The token is {GITHUB} and the model key {ANTHROPIC}.\nAnd the key:\n{SSH_KEY}"
    f"And more:\n{ALL}"
)
NOTED = f"The deploy token is {GITHUB}"
ENDED = f"Done: deploy/credentials.env holds {ANTHROPIC}."

# JSON strings are YAML double-quoted scalars: the file's newlines survive as they are.
LEAKY = f"""
name: leaky
match: {{roles: [coder], labels: [leaky]}}
turns:
  - text: "Writing the deployment credentials."
    tools:
      - write_file: {{path: "deploy/credentials.env", content: {json.dumps(FILE)}}}
  - tools:
      - read_file: {{path: "deploy/credentials.env"}}
  - text: {json.dumps(SAID)}
    tools:
      - diary: {{kind: learning, text: {json.dumps(NOTED)}}}
  - text: {json.dumps(ENDED)}
"""


def database_text() -> str:
    """Every row of every table, as JSON text."""
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')
            rows += [row[0] for row in cursor.fetchall()]
    return "\n".join(rows)


def assert_no_secret(text: str, where: str) -> None:
    """Not a secret, nor any 12 characters of one (a secret cut in two between streamed pieces
    would pass a redaction piece by piece), nor any of the table of shapes."""
    for secret in SECRETS:
        for start in range(len(secret) - 11):
            part = secret[start : start + 12]
            assert part not in text, f"{where} holds {part!r} of {secret[:8]}…"
    assert not leaked(text), f"{where} holds the secrets of {leaked(text)}"


@pytest.fixture
def leaky_quantum(
    repo: Path, scripts: Callable[[str, str], None], make_quantum: Callable[..., Quantum]
) -> Quantum:
    scripts("leaky", LEAKY)
    return make_quantum(labels=["leaky"])


def review_of(quantum: Quantum) -> QuantumRun:
    """A finished quantum run over the agent's branch, for the Tether to review."""
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    return QuantumRun.objects.create(
        wave=wave,
        burst=burst,
        quantum=quantum,
        status=RunStatus.DONE,
        branch=branch_for(quantum.pk),
    )


def test_it_stores_publishes_logs_and_shows_no_secret_an_agent_wrote(
    repo: Path,
    leaky_quantum: Quantum,
    make_run: Callable[..., AgentRun],
    caplog: pytest.LogCaptureFixture,
    client: Client,
):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.db.backends")
    connection.force_debug_cursor = True  # every statement and its parameters in the log too
    try:
        run = make_run("coder", quantum=leaky_quantum)
        outcome = agent_run_execute(agent_run_id=run.pk)
        review = change_review_create(quantum_run_id=review_of(leaky_quantum).pk)
    finally:
        connection.force_debug_cursor = False

    assert outcome.status == "done", outcome.error
    assert_no_secret(outcome.result, "the outcome")
    # Git content stays as the agent wrote it.
    committed = subprocess.run(
        ["git", "show", f"{branch_for(leaky_quantum.pk)}:deploy/credentials.env"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert committed == FILE
    # The change review shows it redacted, and rates it high.
    assert review is not None and review.risk == Risk.HIGH
    assert any("secret in the diff" in reason for reason in review.reasons)
    assert "AWS_SECRET_ACCESS_KEY=…(redacted)" in review.diff
    assert "-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)" in review.diff
    # Nothing in the database: turns, tool calls, events, diary, the run, the review.
    assert_no_secret(database_text(), "the database")
    write = ToolCall.objects.get(agent_run=run, name="write_file")
    assert "GITHUB_TOKEN=ghp_…(redacted)" in write.input["content"]
    read = ToolCall.objects.get(agent_run=run, name="read_file")
    assert "sk-ant-…(redacted)" in read.output  # the model, too, saw the file redacted
    assert "ghp_…(redacted)" in DiaryEntry.objects.get(agent_run=run).text
    # Nothing a live page catches up with, nor the Focus page, nor the log.
    assert_no_secret(str(events_after(topics=[f"agent:{run.agent_id}"], after=0)), "catch-up")
    assert_no_secret(worktree_diff(quantum_id=leaky_quantum.pk), "the Focus diff")
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    page = client.get(reverse("focus", args=[run.pk]))
    assert page.status_code == 200
    assert_no_secret(page.content.decode(), "the Focus page")
    assert "psychonauts_toolcall" in caplog.text  # the statements were logged
    assert_no_secret(caplog.text, "the log")


def test_the_cli_stream_prints_no_secret(
    leaky_quantum: Quantum, capsys: pytest.CaptureFixture[str]
):
    call_command(
        "psychonaut", "run", "--role", "coder", "--quantum", str(leaky_quantum.pk),
        "--provider", "scripted",
    )  # fmt: skip

    printed = capsys.readouterr().out
    assert "The token is ghp_…(redacted)" in printed
    assert "-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)" in printed
    assert_no_secret(printed, "the terminal")


class _Crash(BaseException):
    """The worker dies in the middle of a tool call (not an error the run would record)."""


def test_a_resumed_call_whose_input_held_a_secret_is_not_run_with_the_mark(
    repo: Path,
    scripts: Callable[[str, str], None],
    make_quantum: Callable[..., Quantum],
    make_run: Callable[..., AgentRun],
    monkeypatch: pytest.MonkeyPatch,
):
    # Only the redacted input was stored: run again after a restart, write_file would put
    # `ghp_…(redacted)` in the file where the agent wrote its token.
    scripts(
        "resumed-leak",
        f"""
name: resumed-leak
match: {{roles: [coder], labels: [resumed-leak]}}
turns:
  - tools:
      - write_file: {{path: "creds.env", content: "GITHUB_TOKEN={GITHUB}"}}
  - text: "Done."
""",
    )
    run = make_run("coder", quantum=make_quantum(labels=["resumed-leak"]))

    def crash(*args: object, **kwargs: object) -> None:
        raise _Crash

    with monkeypatch.context() as patch:
        patch.setattr("psychonauts.runtime.runner.tool_execute", crash)
        with pytest.raises(_Crash):
            agent_run_execute(agent_run_id=run.pk)
    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    call = ToolCall.objects.get(agent_run=run)
    assert call.is_error and call.output.startswith("not run: this call's input held a secret")
    worktree = repo.parent / "home" / "worktrees" / f"q-{run.quantum_id}"
    assert not (worktree / "creds.env").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_no_websocket_frame_holds_a_secret(
    leaky_quantum: Quantum, make_run: Callable[..., AgentRun], redis_client: object
) -> None:
    """What a live page receives over its socket: the agent's events caught up, and its rendered
    fragments."""
    run = await database_sync_to_async(make_run)("coder", quantum=leaky_quantum)
    outcome = await database_sync_to_async(agent_run_execute)(agent_run_id=run.pk)
    assert outcome.status == "done", outcome.error
    user = await database_sync_to_async(User.objects.create_user)("op", password="pw-for-tests")
    socket = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost")]
    )
    socket.scope["user"] = user
    connected, _ = await socket.connect()
    assert connected

    await socket.send_json_to(
        {"subscribe": [f"agent:{run.agent_id}"], "after": 0, "page": "focus",
         "params": {"agent_run_id": str(run.pk)}}
    )  # fmt: skip
    frames = []
    while not await socket.receive_nothing(timeout=1.0):
        frames.append(await socket.receive_from())
    await socket.disconnect()

    assert len(frames) >= 5  # the run's events came through
    text = "\n".join(json.dumps(json.loads(f), ensure_ascii=False) for f in frames)
    assert "sk-ant-…(redacted)" in text
    assert_no_secret("\n".join(frames) + text, "the websocket")
