"""The codex executor: the real Codex CLI (the pinned version, `make cli-agents`), in our
sandbox, its Responses API calls through our gateway to the fake Responses API
(`tests/fakes/responses_server.py`), scripted with Codex's own tool names."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from bursts.models import AgentRun
from core.models import Event
from psychonauts.models import Role, ToolCall, Usage, Verification
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from tests.fakes.responses_server import FakeReply, fake_responses_server
from tests.psychonauts.cli_agents import cli_agents_require
from tests.psychonauts.crash import execute_killed_at_marker
from tests.psychonauts.stages import staged_run
from tether.models import Reaching
from tether.services import reaching_answer

# The gateway writes the ledger from its own thread (its own connection): committed data.
pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "gpt-fake-1"


@pytest.fixture(autouse=True)
def model_priced(settings) -> None:
    settings.PSYCHONAUTS_PRICES = {**settings.PSYCHONAUTS_PRICES, MODEL: (1.25, 10.0)}


@pytest.fixture
def codex(monkeypatch) -> None:
    cli_agents_require("codex", monkeypatch)


@pytest.fixture
def codex_role(db, settings) -> Role:
    settings.PSYCHONAUTS_MODELS = {"trivial": MODEL, "standard": MODEL, "complex": MODEL}
    settings.PSYCHONAUTS_TRIVIAL_NO_LLM = False
    roles_sync_defaults()
    role = Role.objects.get(name="coder")
    role.executor, role.provider, role.model = "codex", "openai", MODEL
    role.save()
    return role


def _point(monkeypatch, base_url: str) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-held-by-the-worker")


def _outputs(body: dict[str, Any]) -> int:
    return sum(
        1
        for item in body.get("input", [])
        if isinstance(item, dict)
        and item.get("type") in ("function_call_output", "custom_tool_call_output")
    )


def script(steps: list[FakeReply]):
    """The reply to a request: the step after as many tool outputs as its input holds."""

    def reply(body: dict[str, Any]) -> FakeReply:
        done = _outputs(body)
        return steps[done] if done < len(steps) else FakeReply(text="(script finished)")

    return reply


def _events(run: AgentRun, kind: str) -> list[dict[str, Any]]:
    return [
        e.payload
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type=kind).order_by("id")
    ]


def test_a_codex_agent_fixes_a_bug_and_its_commit_is_verified(
    repo, make_quantum, codex_role, codex, monkeypatch
):
    quantum = make_quantum(verify_commands=["grep -q fixed status.txt"])
    run = staged_run(quantum, "coder", provider="openai", verify=True, verify_retries=0)
    steps = [
        FakeReply(calls=[("exec_command", {"cmd": "echo fixed > status.txt"})]),
        FakeReply(text="Fixed the status."),
    ]
    with fake_responses_server(script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert "Verified: 1 check(s) passed." in outcome.result
    tip = git("rev-parse", branch_for(quantum.pk), cwd=repo).strip()
    assert git("show", f"{tip}:status.txt", cwd=repo).strip() == "fixed"
    assert Verification.objects.get(agent_run=run).commit_sha == tip
    assert [c["name"] for c in _events(run, "tool_call")] == ["exec_command"]
    assert [r["is_error"] for r in _events(run, "tool_result")] == [False]
    assert any("Fixed the status." in e["text"] for e in _events(run, "text"))
    threads = [s["thread_id"] for s in _events(run, "cli_session_started") if s.get("thread_id")]
    assert len(threads) == 1 and threads[0]
    # Every model call went through the gateway with the real key, metered at our prices.
    assert fake.paths and all(p.startswith("/v1/responses") for p in fake.paths)
    assert {h["authorization"] for h in fake.headers} == {
        "Bearer sk-real-openai-key-held-by-the-worker"
    }
    usage = list(Usage.objects.filter(agent_run=run))
    assert len(usage) == len(fake.requests) >= 2
    assert all(u.provider == "codex" and u.model == MODEL and u.cost_usd > 0 for u in usage)
    # Codex's own sub-agents and goals are off: our spawn is the way to sub-agents.
    offered = {t.get("name") for t in fake.requests[0]["tools"]}
    assert "exec_command" in offered and not offered & {"multi_agent_v1", "create_goal"}
    # The role's system prompt is Codex's developer instructions.
    assert "coder psychonaut" in json.dumps(fake.requests[0])


def test_a_codex_agent_asks_the_tether_and_resumes_its_thread_with_the_answer(
    repo, make_quantum, codex_role, codex, monkeypatch
):
    run = staged_run(make_quantum(), "coder", provider="openai")
    ask = {"question": "Keep the old API?", "assumption": "keep it"}
    steps = [
        FakeReply(calls=[("mcp__annihilation__ask_tether", ask)]),
        FakeReply(calls=[("exec_command", {"cmd": "echo dropped > api.txt"})]),
        FakeReply(text="Dropped the old API as the Tether said."),
    ]
    with fake_responses_server(script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        first = agent_run_execute(agent_run_id=run.pk)
        assert first.status == "waiting", first.error
        reaching = Reaching.objects.get(agent_run=run, status="pending")
        asked = len(fake.requests)
        reaching_answer(reaching_id=reaching.pk, text="drop it, nobody uses it")
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert ToolCall.objects.get(agent_run=run, name="ask_tether").output == (
        "The Tether answered: drop it, nobody uses it"
    )
    sessions = _events(run, "cli_session_started")
    threads = {s["thread_id"] for s in sessions if s.get("thread_id")}
    assert len(threads) == 1  # the same thread, resumed
    assert [s["resume"] for s in sessions if "resume" in s] == [False, True]
    resumed = fake.requests[asked:]
    assert resumed and "Keep the old API?" in json.dumps(resumed[0]["input"])
    assert "drop it, nobody uses it" in json.dumps(resumed[0]["input"])
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:api.txt", cwd=repo).strip() == "dropped"


def test_a_killed_worker_resumes_the_codex_thread(
    repo, make_quantum, codex_role, codex, monkeypatch, tmp_path
):
    monkeypatch.setenv("ANNIHILATION_TRIVIAL_NO_LLM", "false")  # the worker process's setting
    run = staged_run(make_quantum(), "coder", provider="openai")
    steps = [
        FakeReply(calls=[("exec_command", {"cmd": "echo fixed > status.txt"})]),
        # Cut off mid-command: the worker is killed once the marker appears.
        FakeReply(
            calls=[("exec_command", {"cmd": "test -e marker || { touch marker; sleep 60; }"})]
        ),
        FakeReply(text="Done after the interruption."),
    ]
    with fake_responses_server(script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        worktree = execute_killed_at_marker(run, repo=repo, tmp_path=tmp_path)
        assert (worktree / "status.txt").read_text() == "fixed\n"
        killed = len(fake.requests)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    sessions = _events(run, "cli_session_started")
    assert [s["resume"] for s in sessions if "resume" in s] == [False, True]
    assert len({s["thread_id"] for s in sessions if s.get("thread_id")}) == 1
    # The thread went on: its conversation holds the first command, and it was told why.
    resumed = json.dumps(fake.requests[killed]["input"])
    assert "echo fixed > status.txt" in resumed and "interrupted" in resumed
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:status.txt", cwd=repo).strip() == "fixed"


def test_a_spent_budget_stops_a_codex_run_before_any_call_leaves(
    repo, make_quantum, codex_role, codex, monkeypatch, settings
):
    settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 0.0
    run = staged_run(make_quantum(), "coder", provider="openai")
    with fake_responses_server(script([FakeReply(text="never")])) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "budget" in outcome.error
    assert fake.requests == []
    assert not Usage.objects.filter(agent_run=run).exists()


def test_a_role_codex_cannot_run_within_its_tools_is_refused(
    repo, make_quantum, codex_role, monkeypatch, tmp_path
):
    monkeypatch.setenv("PSYCHONAUTS_CODEX_BIN", str(_fake_cli(tmp_path, "touch ran\n")))
    codex_role.allowed_tools = ["read_file", "grep"]
    codex_role.save()
    run = staged_run(make_quantum(), "coder", provider="openai")
    outcome = agent_run_execute(agent_run_id=run.pk)
    assert outcome.status == "error"
    assert "cannot run under codex" in outcome.error and "shell" in outcome.error
    assert not list((repo.parent / "home").rglob("ran"))


def _fake_cli(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "fakecodex"
    folder.mkdir()
    folder.chmod(0o755)
    script_file = folder / "codex"
    script_file.write_text("#!/bin/sh\n" + body)
    script_file.chmod(
        script_file.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | 0o044
    )
    return script_file


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo partial > kept.txt\necho boom >&2\nexit 3\n", "codex exited with status 3: boom"),
        ('echo partial > kept.txt\necho \'{"type": "thread.started"\'\n', "malformed JSON"),
        (
            'echo partial > kept.txt\necho \'{"type":"turn.failed","error":{"message":"no"}}\'\n',
            "codex ended in error (turn_failed): no",
        ),
    ],
)
def test_a_failing_codex_is_a_clear_error_and_the_worktree_is_kept(
    repo, make_quantum, codex_role, monkeypatch, tmp_path, body, expected
):
    monkeypatch.setenv("PSYCHONAUTS_CODEX_BIN", str(_fake_cli(tmp_path, body)))
    run = staged_run(make_quantum(), "coder", provider="openai")
    with fake_responses_server(script([])) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)
    assert outcome.status == "error"
    assert expected in outcome.error
    kept = list((repo.parent / "home" / "worktrees").glob("*/kept.txt"))
    assert [p.read_text() for p in kept] == ["partial\n"]
