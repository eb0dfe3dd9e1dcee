"""The claude-code executor: the real Claude Code binary, in our sandbox, behind our gateway,
against the fake Messages API scripted with Claude Code's own tool names.

The binary is the pinned version (`psychonauts.executors.base.CLAUDE_CODE_VERSION`), installed by
`make cli-agents` (`tests/psychonauts/cli_agents.py` says where); the tests that need it are
skipped, saying how to install it, when it is not there.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from bursts.models import AgentRun
from bursts.services.agent_runs import agent_runs_cancel_live
from bursts.services.resume import agent_resume
from core.models import Event
from psychonauts.errors import SuspendRun
from psychonauts.executors.base import CLAUDE_CODE_VERSION, executor_status
from psychonauts.executors.gateway import DUMMY_KEY, Gateway
from psychonauts.models import AgentTurn, Role, ToolCall, Usage, Verification
from psychonauts.roles import roles_sync_defaults
from psychonauts.routing import ratelimits
from psychonauts.runtime import budget
from psychonauts.runtime.budget import CallCheck, cost_usd
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server
from tests.fakes.claude_code_script import claude_code_script
from tests.psychonauts.cli_agents import cli_agents_require
from tests.psychonauts.crash import execute_killed_at_marker, wait_for
from tests.psychonauts.stages import staged_run
from tether.models import Reaching
from tether.services import reaching_answer

# The gateway writes the ledger from its own thread (its own connection): committed data.
pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "claude-fake-1"


@pytest.fixture(autouse=True)
def model_priced(settings) -> None:
    """The fake model has a price, so its calls count against budgets."""
    settings.PSYCHONAUTS_PRICES = {**settings.PSYCHONAUTS_PRICES, MODEL: (3.0, 15.0)}


@pytest.fixture
def claude(settings, monkeypatch) -> None:
    cli_agents_require("claude-code", monkeypatch)


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


def _assert_session_resumed_and_a_committed(run: AgentRun, repo: Path) -> None:
    """The CLI's session was started, then resumed once; the file it wrote is on its branch."""
    sessions = [
        e.payload["resume"]
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type="cli_session_started")
    ]
    assert sessions == [False, True]
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:a.txt", cwd=repo).strip() == "a"


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


def test_a_spend_gate_s_hold_makes_the_cli_run_wait_and_its_release_resumes_the_session(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    holding: list[bool] = []

    def gate(check: CallCheck) -> None:
        # From the run's second agent call on, until released (as the autopilot's caps hold).
        if len(_agent_requests(fake)) == 1 and not holding:
            holding.append(True)
        if holding and holding[-1]:
            raise SuspendRun("held by a budget: the day's cap is reached")

    monkeypatch.setattr(budget, "SPEND_GATES", [gate])
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    steps = [
        FakeReply(tool_uses=[("Write", {"file_path": "a.txt", "content": "a\n"})]),
        FakeReply(text="Wrote a.txt."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        first = agent_run_execute(agent_run_id=run.pk)

        # Held, not failed: the run waits holding no worker; the held call never left.
        assert first.status == "waiting", first.error
        assert "held by a budget" in first.error
        assert AgentRun.objects.get(pk=run.pk).status == "waiting"
        assert len(_agent_requests(fake)) == 1
        holding.append(False)
        assert agent_resume(agent_run_id=run.pk)  # the hold's release
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    _assert_session_resumed_and_a_committed(run, repo)


def test_a_long_rate_limit_makes_the_cli_run_wait_holding_no_worker_then_resume(
    repo, make_quantum, cli_role, claude, monkeypatch, redis_client
):
    # The upstream refuses the run's second agent call once, asking for an hour.
    script = claude_code_script(
        [
            FakeReply(tool_uses=[("Write", {"file_path": "a.txt", "content": "a\n"})]),
            FakeReply(text="Wrote a.txt."),
        ]
    )
    limited: list[bool] = []

    def reply(body: dict) -> FakeReply:
        if body.get("tools") and len(_agent_requests(fake)) == 2 and not limited:
            limited.append(True)
            return FakeReply(status=429, error="rate_limit_error", retry_after="3600")
        return script(body)

    run = staged_run(make_quantum(), "coder", provider="anthropic")
    with fake_anthropic_server(reply) as fake:
        _point(monkeypatch, fake.base_url)
        first = agent_run_execute(agent_run_id=run.pk)

        assert first.status == "waiting", first.error
        assert "rate-limited by endpoint" in first.error and "3600s" in first.error
        assert AgentRun.objects.get(pk=run.pk).status == "waiting"
        due = redis_client.zscore(ratelimits.RESUME_KEY, str(run.pk))
        assert due is not None and due > time.time() + 3500  # woken when the hour is over
        assert agent_resume(agent_run_id=run.pk)  # what the wait's end does
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    _assert_session_resumed_and_a_committed(run, repo)


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


def test_the_cli_asks_the_tether_waits_holding_no_worker_and_resumes_with_the_answer(
    repo, make_quantum, cli_role, claude, monkeypatch, tmp_path
):
    # The state folders on storage every worker mounts: the resuming worker finds the session.
    shared = tmp_path / "shared-cli-state"
    monkeypatch.setenv("PSYCHONAUTS_CLI_STATE_DIR", str(shared))
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    ask = {"question": "Keep the old API?", "assumption": "keep it"}
    steps = [
        FakeReply(tool_uses=[("mcp__annihilation__ask_tether", ask)]),
        FakeReply(tool_uses=[("Write", {"file_path": "api.txt", "content": "dropped\n"})]),
        FakeReply(text="Dropped the old API as the Tether said."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        first = agent_run_execute(agent_run_id=run.pk)

        # The CLI was stopped and the run waits, its worker free, its question open.
        assert first.status == "waiting", first.error
        assert AgentRun.objects.get(pk=run.pk).status == "waiting"
        reaching = Reaching.objects.get(agent_run=run, status="pending")
        assert reaching.question == "Keep the old API?"
        asked = len(_agent_requests(fake))
        reaching_answer(reaching_id=reaching.pk, text="drop it, nobody uses it")
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert ToolCall.objects.get(agent_run=run, name="ask_tether").output == (
        "The Tether answered: drop it, nobody uses it"
    )
    sessions = [
        e.payload
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type="cli_session_started")
    ]
    assert [s["resume"] for s in sessions] == [False, True]
    # The session went on (its conversation holds the question) with the answer, once.
    resumed = _agent_requests(fake)[asked:]
    assert resumed and "Keep the old API?" in json.dumps(resumed[0]["messages"])
    assert "drop it, nobody uses it" in json.dumps(resumed[0]["messages"])
    assert sum("drop it, nobody uses it" in json.dumps(r["messages"][-1]) for r in resumed) == 1
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:api.txt", cwd=repo).strip() == "dropped"
    assert not AgentTurn.objects.filter(agent_run=run, complete=False).exists()
    assert list((shared / run.agent_id / "claude").glob("projects/*/*.jsonl"))


def test_a_question_answered_on_a_host_without_the_session_starts_over_with_the_answer(
    repo, make_quantum, cli_role, claude, monkeypatch, settings
):
    quantum = make_quantum(body="Fix the status file.")
    run = staged_run(quantum, "coder", provider="anthropic")
    ask = {"question": "Which status?", "assumption": "fixed"}
    asking = claude_code_script([FakeReply(tool_uses=[("mcp__annihilation__ask_tether", ask)])])

    def reply(body: dict[str, Any]) -> FakeReply:
        # The model asks until its conversation holds the answer.
        if body.get("tools") and "use 'fixed'" in json.dumps(body["messages"]):
            return FakeReply(text="Done as told.")
        return asking(body)

    with fake_anthropic_server(reply) as fake:
        _point(monkeypatch, fake.base_url)
        assert agent_run_execute(agent_run_id=run.pk).status == "waiting"
        # Resumed on another host: the session's state folder is not there.
        shutil.rmtree(Path(settings.ANNIHILATION_HOME) / "cli-state" / run.agent_id)
        reaching = Reaching.objects.get(agent_run=run, status="pending")
        reaching_answer(reaching_id=reaching.pk, text="use 'fixed'")
        asked = len(_agent_requests(fake))
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    sessions = [
        e.payload["resume"]
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type="cli_session_started")
    ]
    assert sessions == [False, False]
    # A new session: the agent's task and the answer it waited for, in its first message.
    first = json.dumps(_agent_requests(fake)[asked]["messages"])
    assert "Fix the status file." in first and "use 'fixed'" in first


def test_a_permission_prompt_is_a_question_to_the_tether_and_its_yes_allows_that_use(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    run = staged_run(make_quantum(), "coder", provider="anthropic")
    settings_file = {"file_path": ".claude/settings.json", "content": "{}\n"}
    steps = [
        # Its own settings: Claude Code asks before it writes them, whatever the rules allow.
        FakeReply(tool_uses=[("Write", settings_file)]),
        FakeReply(tool_uses=[("Write", settings_file)]),
        FakeReply(text="Wrote the notes."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        first = agent_run_execute(agent_run_id=run.pk)

        # Not approved silently: the run waits on the Tether's answer.
        assert first.status == "waiting", first.error
        reaching = Reaching.objects.get(agent_run=run, status="pending")
        assert "permission to use Write" in reaching.question
        assert ".claude/settings.json" in reaching.question
        reaching_answer(reaching_id=reaching.pk, text="yes")
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert Reaching.objects.filter(agent_run=run).count() == 1  # its yes allowed the retry
    results = [
        e.payload
        for e in Event.objects.filter(topic=f"agent:{run.agent_id}", type="tool_result").order_by(
            "id"
        )
        if e.payload.get("id", "").startswith("toolu_")
    ]
    assert results and results[-1]["is_error"] is False, results
    tip = git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()
    assert git("show", f"{tip}:.claude/settings.json", cwd=repo).strip() == "{}"


def test_a_reviewing_cli_ends_with_the_verdict_it_reported_over_mcp(
    repo, make_quantum, cli_role, claude, monkeypatch
):
    reviewer = Role.objects.get(name="reviewer")
    reviewer.executor, reviewer.provider, reviewer.model = "claude-code", "anthropic", MODEL
    reviewer.save()
    run = staged_run(make_quantum(), "reviewer", provider="anthropic", verdict_blocks=True)
    verdict = {"verdict": "fail", "reasons": "README.md:1 says nothing of the change"}
    steps = [
        FakeReply(tool_uses=[("mcp__annihilation__diary", {"kind": "learning", "text": "ok"})]),
        FakeReply(tool_uses=[("mcp__annihilation__report_verdict", verdict)]),
        FakeReply(text="Reviewed."),
    ]
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        _point(monkeypatch, fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error == "README.md:1 says nothing of the change"
    assert "VERDICT: FAIL" in AgentRun.objects.get(pk=run.pk).result
    # The CLI saw our tools, and their results came back to it.
    offered = {t["name"] for t in _agent_requests(fake)[0]["tools"]}
    assert {"mcp__annihilation__report_verdict", "mcp__annihilation__diary"} <= offered
    assert "mcp__annihilation__ask_tether" not in offered  # not the reviewer's
    assert "verdict recorded: fail" in json.dumps(_agent_requests(fake)[-1]["messages"])


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
    monkeypatch.setenv("PSYCHONAUTS_CODEX_BIN", str(tmp_path / "none" / "codex"))
    out = StringIO()
    call_command("psychonaut", "executors", "--json", stdout=out)
    found = {e["name"]: e for e in json.loads(out.getvalue())}
    assert found["ours"]["available"] is True
    assert found["claude-code"]["available"] is False
    assert "make cli-agents" in found["claude-code"]["detail"]
    assert found["codex"]["available"] is False
    assert "make cli-agents" in found["codex"]["detail"]
