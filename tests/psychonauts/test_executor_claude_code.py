"""The claude-code executor: the real Claude Code binary, in our sandbox, behind our gateway,
against the fake Messages API scripted with Claude Code's own tool names.

The binary is the pinned version (`psychonauts.executors.base.CLAUDE_CODE_VERSION`), installed
once with npm into a cache folder (ANNIHILATION_CLI_CACHE, default ~/.cache/annihilation); the
tests that need it are skipped, saying why, when it is not there and npm cannot fetch it.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from bursts.models import AgentRun
from bursts.services.agent_runs import agent_runs_cancel_live
from core.models import Event
from psychonauts.executors.base import CLAUDE_CODE_VERSION, executor_status
from psychonauts.executors.gateway import DUMMY_KEY, Gateway
from psychonauts.git import git
from psychonauts.models import Role, Usage, Verification
from psychonauts.roles import roles_sync_defaults
from psychonauts.services import agent_run_execute
from psychonauts.services.budget import cost_usd
from psychonauts.workspaces import branch_for
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server
from tests.fakes.claude_code_script import claude_code_script
from tests.psychonauts.crash import execute_killed_at_marker, wait_for
from tests.psychonauts.stages import staged_run

# The gateway writes the ledger from its own thread (its own connection): committed data.
pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "claude-fake-1"
CACHE = (
    Path(os.environ.get("ANNIHILATION_CLI_CACHE", Path.home() / ".cache" / "annihilation"))
    / f"cli-agents-{CLAUDE_CODE_VERSION}"
)
BINARY = CACHE / "node_modules/@anthropic-ai/claude-code/bin/claude.exe"


def _installed() -> str:
    """'' when the pinned Claude Code is in the cache (installed now if npm can), else why not."""
    if BINARY.is_file():
        return ""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed: Claude Code cannot be fetched"
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
         f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not BINARY.is_file():
        return f"the npm registry is not reachable for Claude Code: {done.stderr.strip()[-300:]}"
    return ""


@pytest.fixture(autouse=True)
def model_priced(settings) -> None:
    """The fake model has a price, so its calls count against budgets."""
    settings.PSYCHONAUTS_PRICES = {**settings.PSYCHONAUTS_PRICES, MODEL: (3.0, 15.0)}


@pytest.fixture
def claude(settings, monkeypatch) -> Path:
    why = _installed()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("PSYCHONAUTS_CLI_AGENTS_DIR", str(CACHE))
    monkeypatch.delenv("PSYCHONAUTS_CLAUDE_BIN", raising=False)
    return BINARY


@pytest.fixture
def cli_role(db, settings) -> Role:
    settings.PSYCHONAUTS_MODELS = {"trivial": MODEL, "standard": MODEL, "complex": MODEL}
    settings.PSYCHONAUTS_TRIVIAL_NO_LLM = False
    roles_sync_defaults()
    role = Role.objects.get(name="coder")
    role.executor, role.provider, role.model = "claude-code", "anthropic", MODEL
    role.save()
    return role


def _point(monkeypatch, base_url: str) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-real-key-held-by-the-worker")


def _agent_requests(fake) -> list[dict]:
    return [r for r in fake.requests if r.get("tools")]


def test_an_agent_fixes_a_bug_and_its_commit_is_verified(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    quantum = make_quantum(verify_commands=["grep -q fixed status.txt", "test -x run.sh"])
    run = staged_run(quantum, "coder", provider="anthropic", verify=True, verify_retries=0)
    steps = [
        FakeReply(tool_uses=[("Write", {"file_path": "status.txt", "content": "fixed\n"})]),
        FakeReply(
            tool_uses=[
                ("Bash", {"command": "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod +x run.sh"})
            ]
        ),
        FakeReply(text="Fixed the status and added run.sh."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert "Verified: 2 check(s) passed." in outcome.result
    tip = git("rev-parse", branch_for(quantum.pk), cwd=repo).strip()
    assert git("show", f"{tip}:status.txt", cwd=repo).strip() == "fixed"
    assert Verification.objects.get(agent_run=run).commit_sha == tip
    topic = f"agent:{run.agent_id}"
    calls = [e.payload["name"] for e in Event.objects.filter(topic=topic, type="tool_call")]
    assert calls == ["Write", "Bash"]
    assert Event.objects.filter(topic=topic, type="cli_session_started").exists()
    # Every model call went through the gateway and is in the ledger at our prices.
    usage = list(Usage.objects.filter(agent_run=run))
    assert len(usage) == len(fake.requests) >= 3
    assert all(u.provider == "claude-code" and u.model == MODEL for u in usage)
    run.refresh_from_db()
    assert run.tokens_in == sum(u.tokens_in for u in usage) > 0


def test_a_spent_budget_refuses_the_first_call_and_stops_the_run(
    repo, make_quantum, cli_role, claude, monkeypatch, settings
):
    settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 0.0
    quantum = make_quantum()
    run = staged_run(quantum, "coder", provider="anthropic")
    steps = [FakeReply(tool_uses=[("Write", {"file_path": "x.txt", "content": "x\n"})])]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "budget" in outcome.error and "refused" not in outcome.error.lower()[:0]
    assert _agent_requests(fake) == []  # nothing reached the model
    assert not Usage.objects.filter(agent_run=run).exists()


def test_a_killed_worker_resumes_the_cli_session(
    repo, make_quantum, cli_role, claude, monkeypatch, tmp_path
):
    monkeypatch.setenv("ANNIHILATION_TRIVIAL_NO_LLM", "false")  # the worker process's setting
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    steps = [
        FakeReply(tool_uses=[("Write", {"file_path": "status.txt", "content": "fixed\n"})]),
        # Cut off mid-command: the worker is killed once the marker appears.
        FakeReply(
            tool_uses=[("Bash", {"command": "test -e marker || { touch marker; sleep 60; }"})]
        ),
        FakeReply(text="Done after the interruption."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        worktree = execute_killed_at_marker(run, repo=repo, tmp_path=tmp_path)
        assert (worktree / "status.txt").read_text() == "fixed\n"
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    sessions = [
        e.payload
        for e in Event.objects.filter(
            topic=f"agent:{run.agent_id}", type="cli_session_started"
        ).order_by("id")
    ]
    assert [s["resume"] for s in sessions] == [False, True]
    assert sessions[0]["session_id"] == sessions[1]["session_id"]
    # The resumed CLI carried its conversation on: the Write is not asked for again.
    resumed = [r for r in _agent_requests(fake) if "interrupted" in json.dumps(r["messages"])]
    assert resumed and "status.txt" in json.dumps(resumed[0]["messages"])
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:status.txt", cwd=repo).strip() == "fixed"


def test_the_cli_keeps_the_run_alive_and_a_cancel_stops_it(
    repo, make_quantum, cli_role, claude, monkeypatch, settings
):
    settings.BURSTS_HEARTBEAT_TTL_S = 0.6  # a beat every 0.2 s
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    steps = [FakeReply(tool_uses=[("Bash", {"command": "touch marker; sleep 60"})])]
    worktree = repo.parent / "home" / "worktrees" / f"q-{run.quantum_id}"
    beats: list[object] = []

    def cancel_once_working() -> None:
        wait_for(lambda: (worktree / "marker").exists(), timeout=60)
        first = AgentRun.objects.get(pk=run.pk).heartbeat_at
        wait_for(lambda: AgentRun.objects.get(pk=run.pk).heartbeat_at != first, timeout=10)
        beats.append(first)
        agent_runs_cancel_live(
            quantum_run_ids=[run.quantum_run_id or 0],
            error="cancelled in the test",
            now=timezone.now(),
        )
        connection.close()

    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        canceller = threading.Thread(target=cancel_once_working)
        canceller.start()
        started = time.monotonic()
        outcome = agent_run_execute(agent_run_id=run.pk)
        canceller.join()

    assert beats, "the heartbeat never moved while the CLI worked"
    assert outcome.status == "cancelled"
    assert time.monotonic() - started < 50  # not the command's 60 s


def test_a_repository_s_claude_settings_do_not_widen_the_role_s_tools(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    # The repository allows every command and adds a hook; the role allows no shell.
    settings_file = repo / ".claude" / "settings.json"
    settings_file.parent.mkdir()
    settings_file.write_text(
        json.dumps(
            {
                "permissions": {"allow": ["Bash(*)", "Bash"], "defaultMode": "bypassPermissions"},
                "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "touch hooked"}]}]},
            }
        )
    )
    git("add", ".claude", cwd=repo)
    git("commit", "-qm", "claude settings", cwd=repo)
    cli_role.allowed_tools = ["read_file", "write_file", "edit_file"]
    cli_role.save()
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    steps = [
        FakeReply(tool_uses=[("Bash", {"command": "touch pwned"})]),
        FakeReply(tool_uses=[("NoSuchTool", {"x": 1})]),
        FakeReply(text="Could not run it."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    worktree = repo.parent / "home" / "worktrees" / f"q-{run.quantum_id}"
    assert not (worktree / "pwned").exists()
    assert not (worktree / "hooked").exists()
    results = [
        e.payload
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type="tool_result").order_by(
            "id"
        )
    ]
    assert [r["is_error"] for r in results] == [True, True]  # refused; no such tool


def test_the_cli_s_stream_is_redacted_in_the_run_s_events(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    secret = "sk-ant-" + "Zq3" * 12
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    steps = [
        FakeReply(
            text=f"The key is {secret}.",
            tool_uses=[("Write", {"file_path": "key.txt", "content": f"{secret}\n"})],
        ),
        FakeReply(text=f"Wrote {secret} to key.txt."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    events = list(Event.objects.filter(topic=f"agent:{run.agent_id}"))
    assert {"text", "tool_call", "tool_result"} <= {e.type for e in events}
    stored = json.dumps([e.payload for e in events])
    assert secret not in stored and "sk-ant-" in stored
    assert secret not in outcome.result


def _post(gateway: Gateway, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A request to the gateway over its unix socket, as the CLI in the sandbox sends it."""
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(gateway.socket))
    data = json.dumps(body).encode()
    conn.request(
        "POST", "/v1/messages?beta=true", body=data,
        headers={"content-type": "application/json", "x-api-key": DUMMY_KEY},
    )  # fmt: skip
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, json.loads(payload) if response.status != 200 else {}


def test_the_gateway_forwards_with_the_real_key_and_refuses_other_models_with_a_400(
    repo, make_quantum, cli_role, monkeypatch, settings
):
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    message = {"max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with fake_anthropic_server([FakeReply(text="hello", tokens_in=100, tokens_out=20)]) as fake:
        _point(monkeypatch, fake.base_url)
        with Gateway(
            run, provider="claude-code", allowed_models=frozenset({MODEL}), wave=None
        ) as gateway:
            status, _ = _post(gateway, {"model": MODEL, **message})
            assert status == 200
            status, error = _post(gateway, {"model": "claude-opus-9", **message})
            # Not 429/529: the CLIs retry those for minutes.
            assert status == 400
            assert error["error"]["type"] == "invalid_request_error"
            assert "'claude-opus-9' is not allowed" in error["error"]["message"]
            settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 0.0
            status, error = _post(gateway, {"model": MODEL, **message})
            assert status == 400 and "budget" in error["error"]["message"]
    assert len(fake.requests) == 1  # the refused calls never left the worker
    assert fake.headers[0]["x-api-key"] == "sk-real-key-held-by-the-worker"
    usage = Usage.objects.get(agent_run=run)
    assert (usage.tokens_in, usage.tokens_out) == (100, 20)
    expected = cost_usd(MODEL, 100, 20)
    assert expected is not None and usage.cost_usd == expected > 0 and usage.priced


def _fake_cli(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "fakecli"
    folder.mkdir()
    folder.chmod(0o755)
    script = folder / "claude"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | 0o044)
    return script


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo partial > kept.txt\necho boom >&2\nexit 3\n", "exited with status 3: boom"),
        ("echo partial > kept.txt\necho 'this is not json'\n", "malformed JSON"),
    ],
)
def test_a_failing_cli_is_a_clear_error_and_the_worktree_is_kept(
    repo, make_quantum, cli_role, monkeypatch, tmp_path, body, expected
):
    monkeypatch.setenv("PSYCHONAUTS_CLAUDE_BIN", str(_fake_cli(tmp_path, body)))
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    with fake_anthropic_server(claude_code_script([])) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)
    assert outcome.status == "error"
    assert expected in outcome.error
    # What the CLI wrote before it failed is still in the quantum's worktree.
    kept = list((repo.parent / "home" / "worktrees").glob("*/kept.txt"))
    assert [p.read_text() for p in kept] == ["partial\n"]


def test_a_missing_cli_is_a_clear_error(repo, make_quantum, cli_role, monkeypatch, tmp_path):
    monkeypatch.setenv("PSYCHONAUTS_CLAUDE_BIN", str(tmp_path / "nowhere" / "claude"))
    assert not executor_status("claude-code").available
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    outcome = agent_run_execute(agent_run_id=run.pk)
    assert outcome.status == "error"
    assert "not installed" in outcome.error


def test_a_role_file_names_its_executor_and_a_typo_is_refused(tmp_path):
    from psychonauts.errors import InvalidDefinition
    from psychonauts.roles import role_parse

    good = tmp_path / "cli.yaml"
    good.write_text("name: cli\nexecutor: claude-code\nsystem_prompt: hi\n")
    assert role_parse(good)["executor"] == "claude-code"
    default = tmp_path / "default.yaml"
    default.write_text("name: default\nsystem_prompt: hi\n")
    assert role_parse(default)["executor"] == "ours"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nexecutor: claude\nsystem_prompt: hi\n")
    with pytest.raises(InvalidDefinition, match="unknown executor 'claude'"):
        role_parse(bad)


def test_make_installs_the_versions_the_executors_are_tested_against(settings):
    from psychonauts.executors.base import CODEX_VERSION

    makefile = (Path(settings.BASE_DIR) / "Makefile").read_text()
    assert f"CLAUDE_CODE_VERSION := {CLAUDE_CODE_VERSION}\n" in makefile
    assert f"CODEX_VERSION := {CODEX_VERSION}\n" in makefile


def test_the_executors_command_says_what_is_available_and_why_not(monkeypatch, tmp_path):
    from io import StringIO

    from django.core.management import call_command

    monkeypatch.setenv("PSYCHONAUTS_CLAUDE_BIN", str(tmp_path / "none" / "claude"))
    out = StringIO()
    call_command("psychonaut", "executors", "--json", stdout=out)
    found = {e["name"]: e for e in json.loads(out.getvalue())}
    assert found["ours"]["available"] is True
    assert found["claude-code"]["available"] is False
    assert "make cli-agents" in found["claude-code"]["detail"]
    assert found["codex"]["available"] is False and "not implemented" in found["codex"]["detail"]
