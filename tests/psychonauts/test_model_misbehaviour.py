"""What a real small model does wrong, replayed through the fake OpenAI server (its answers
recorded in tests/fakes/real_model_replies.py): the runtime gives one clear second chance, runs
no call the output limit cut, keeps each request within the endpoint's context, parses text tool
calls only for an endpoint marked so, and learns nothing from an infrastructure error. Real
agent runs through `agent_run_execute`, the real SDK, real Postgres and Redis."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from bursts.models import AgentRun
from core.models import Event
from psychonauts.errors import INFRASTRUCTURE
from psychonauts.models import AgentTurn, Endpoint, Role, ToolCall
from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import endpoint_add
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.worktrees import worktree_path
from reflection.extraction import findings
from reflection.reflector import transcript
from tests.fakes import real_model_replies as recorded
from tests.fakes.openai_server import FakeReply, fake_openai_server
from tests.polling import wait_for
from tests.psychonauts.stages import staged_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh(settings, redis_client, monkeypatch):
    settings.ENDPOINTS_CACHE_S = 0
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    endpoints.registry_invalidate()
    yield
    endpoints.registry_invalidate()


def _run(make_run, make_quantum, role, server, **endpoint):
    endpoint_add(name="local", model="qwen-coder", base_url=server.base_url, **endpoint)
    quantum = make_quantum("Add a greeting", complexity="standard")
    run = make_run(role, quantum=quantum, provider="openai")
    outcome = agent_run_execute(agent_run_id=run.pk)
    run.refresh_from_db()
    return run, outcome


# --- a verdict, and one reminder --------------------------------------------------------------


def test_a_recorded_verdict_ends_a_reviewer_that_would_call_it_again(repo, make_run, make_quantum):
    # The model calls report_verdict turn after turn: the first recorded one is its last word.
    replies = [recorded.repeated_verdict(n) for n in range(1, 30)]
    with fake_openai_server(replies) as server:
        run, outcome = _run(make_run, make_quantum, "reviewer", server)

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("VERDICT: PASS\nlooks fine (call 1)")
    assert len(server.requests) == 1
    assert ToolCall.objects.filter(agent_run=run, name="report_verdict").count() == 1


def test_a_missing_verdict_gets_one_reminder_turn(repo, make_run, make_quantum):
    replies = [
        FakeReply(text='report_verdict(verdict="pass")'),  # the call written as prose
        FakeReply(tool_calls=[("report_verdict", {"verdict": "pass", "reasons": "fine"})]),
    ]
    with fake_openai_server(replies) as server:
        run, outcome = _run(make_run, make_quantum, "reviewer", server)

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("VERDICT: PASS\nfine")
    reminder = server.requests[1]["messages"][-1]
    assert reminder["role"] == "user" and "report_verdict" in reminder["content"]
    assert Event.objects.filter(topic=f"agent:{run.agent_id}", type="verdict_reminded").exists()


def test_a_verdict_still_missing_after_its_reminder_fails_the_run(repo, make_run, make_quantum):
    replies = [FakeReply(text="APPROVE"), FakeReply(text="I approve."), FakeReply(text="x")]
    with fake_openai_server(replies) as server:
        _, outcome = _run(make_run, make_quantum, "reviewer", server)

    assert outcome.status == "error"
    assert outcome.error.startswith("no verdict")
    assert len(server.requests) == 2  # the answer, the one reminder: no third chance


# --- a call cut by the output limit -----------------------------------------------------------


def test_a_tool_call_cut_by_the_output_limit_is_not_run_and_the_model_is_told(
    repo, make_run, make_quantum
):
    replies = [recorded.cut_tool_call(), FakeReply(text="I will stop here.")]
    with fake_openai_server(replies) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server)

    assert outcome.status == "done", outcome.error
    assert not (worktree_path(run.quantum_id) / "hello.txt").exists()
    call = ToolCall.objects.get(agent_run=run, name="write_file")
    assert call.is_error and call.output.startswith("not run: your answer was cut off")
    told = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert "cut off at the output limit" in told[0]["content"]


def test_an_answer_cut_by_the_output_limit_is_not_taken_as_the_final_answer(
    repo, make_run, make_quantum
):
    replies = [recorded.cut_text_call(), FakeReply(text="Done: nothing to change.")]
    with fake_openai_server(replies) as server:
        _, outcome = _run(make_run, make_quantum, "coder", server)

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("Done: nothing to change.")
    told = server.requests[1]["messages"][-1]
    assert told["role"] == "user" and "cut off at the output limit" in told["content"]


# --- tool calls written as text ----------------------------------------------------------------


def test_an_endpoint_marked_so_has_fenced_json_tool_calls_run(repo, make_run, make_quantum):
    replies = [recorded.text_tool_call(), FakeReply(text="Wrote hello.txt.")]
    with fake_openai_server(replies) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server, text_tool_calls=True)

    assert outcome.status == "done", outcome.error
    assert (worktree_path(run.quantum_id) / "hello.txt").read_text() == "hi"
    # The call went back to the model as a call and its result, as the API shapes them.
    assistant = server.requests[1]["messages"][-2]
    assert assistant["tool_calls"][0]["function"]["name"] == "write_file"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "path": "hello.txt",
        "content": "hi",
    }


def test_without_the_mark_text_stays_text(repo, make_run, make_quantum):
    with fake_openai_server([recorded.text_tool_call()]) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server)

    assert outcome.status == "done", outcome.error
    assert '"name": "write_file"' in outcome.result
    assert not (worktree_path(run.quantum_id) / "hello.txt").exists()


@pytest.mark.parametrize(
    "text",
    [
        # a tool the agent does not have
        '```json\n{"name": "rm_rf", "arguments": {"path": "."}}\n```',
        # more than a call
        '```json\n{"name": "write_file", "arguments": {"path": "a"}, "why": "x"}\n```',
        # not an object of arguments
        '```json\n{"name": "write_file", "arguments": ["a"]}\n```',
        # the real model's file content as a Python string: not JSON
        recorded.TEXT_CALL_PYTHON_STRING,
        # one block is a call, the other is not: none is taken
        '```json\n{"name": "write_file", "arguments": {"path": "a", "content": "b"}}\n```\n'
        '```json\n{"example": true}\n```',
    ],
)
def test_text_that_is_not_strictly_a_call_stays_text(repo, make_run, make_quantum, text):
    with fake_openai_server([FakeReply(text=text)]) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server, text_tool_calls=True)

    assert outcome.status == "done", outcome.error
    assert not ToolCall.objects.filter(agent_run=run).exists()


# --- context -----------------------------------------------------------------------------------

BIG = "def f():\n    return 1\n" * 600  # about 13,000 characters


def test_requests_stay_within_the_endpoints_context_by_trimming_old_tool_results(
    repo, make_run, make_quantum
):
    # Three big files, read one after the other (the same read three times would be a loop).
    for n in range(3):
        (repo / f"big{n}.py").write_text(BIG)
    import subprocess

    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "big"],
        cwd=repo,
        check=True,
    )
    reads = [
        FakeReply(tool_calls=[("read_file", {"path": f"big{n}.py"})], tokens_in=2000 + 3000 * n)
        for n in range(3)
    ]
    with fake_openai_server([*reads, FakeReply(text="Read it.")]) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server, context_tokens=8192)

    assert outcome.status == "done", outcome.error
    sizes = [len(json.dumps(r["messages"])) for r in server.requests]
    # Each request, at three characters a token (a low estimate for code), and its answer fit.
    tools = len(json.dumps(server.requests[0]["tools"]))
    answer = server.requests[0]["max_tokens"]
    assert all((size + tools) / 3 + answer <= 8192 for size in sizes), (sizes, tools)
    assert max(sizes) > 2 * len(BIG) / 3  # not trimmed to nothing
    assert server.requests[0]["max_tokens"] <= 8192 // 4
    last = server.requests[-1]["messages"]
    tool_messages = [m["content"] for m in last if m["role"] == "tool"]
    assert "left out to keep the conversation within the model's context" in tool_messages[0]
    assert tool_messages[-1].startswith("def f():")  # the latest keeps its head
    trimmed = Event.objects.filter(topic=f"agent:{run.agent_id}", type="context_trimmed")
    assert trimmed.exists()
    assert trimmed.latest("id").payload["context_tokens"] == 8192


def test_a_context_overflow_is_an_infrastructure_error_reflection_learns_nothing_from(
    repo, make_quantum, settings
):
    settings.PSYCHONAUTS_PROVIDER = ""
    with fake_openai_server([recorded.context_overflow()]) as server:
        endpoint_add(name="local", model="qwen-coder", base_url=server.base_url)
        quantum = make_quantum("Add a greeting", complexity="standard")
        run = staged_run(quantum, "coder", provider="openai")
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith(INFRASTRUCTURE)
    assert "exceeds the available context size" in outcome.error
    run.refresh_from_db()
    assert run.quantum_run is not None
    found, _ = findings(run.quantum_run.burst_id)
    assert not [f for f in found if f.kind == "failure"]
    text = transcript(run.quantum_run, [AgentRun.objects.get(pk=run.pk)])
    assert "exceeds the available context" not in text
    assert "infrastructure failure" in text
    # Not a failure of the endpoint either: the request was the problem.
    assert not endpoints.endpoints_failing()


def test_a_model_that_keeps_answering_is_stopped_when_the_run_s_time_runs_out(
    repo, make_run, make_quantum
):
    # 400 pieces 50 ms apart: 20 s of answer against the role's 1 s.
    Role.objects.filter(name="coder").update(timeout_s=1)
    slow = FakeReply(text="la " * 700, drip_s=0.05)
    with fake_openai_server([slow]) as server:
        run, outcome = _run(make_run, make_quantum, "coder", server)
        # The server sees the closed connection when it sends its next piece.
        wait_for(lambda: server.gave_up, timeout=5, what="the server to see the call given up")

    assert outcome.status == "error"
    assert outcome.error.startswith("timeout: "), outcome.error
    assert "was still answering when the run's time ran out" in outcome.error
    assert server.gave_up == 1  # the answer was cut off, not read to its end
    assert not AgentTurn.objects.filter(agent_run=run, complete=True).exists()


# --- the registry's small things -----------------------------------------------------------------


def test_a_disabled_endpoint_can_be_checked_by_name(repo, capsys):
    with fake_openai_server([], models=["qwen-coder"]) as server:
        endpoint_add(name="local", model="qwen-coder", base_url=server.base_url, enabled=False)
        call_command("endpoints", "check", "local")

    assert "up" in capsys.readouterr().out
    assert Endpoint.objects.get(name="local").health == "up"


def test_spawn_with_both_one_agent_and_a_list_is_refused_and_starts_nothing(
    repo, make_run, make_quantum
):
    spawn = {
        "role": "coder",
        "task": "one thing",
        "agents": [{"role": "coder", "task": "another"}],
    }
    replies = [FakeReply(tool_calls=[("spawn", spawn)]), FakeReply(text="Understood.")]
    with fake_openai_server(replies) as server:
        run, outcome = _run(make_run, make_quantum, "planner", server)

    assert outcome.status == "done", outcome.error
    call = ToolCall.objects.get(agent_run=run, name="spawn")
    assert call.is_error and "ambiguous" in call.output
    assert not AgentRun.objects.filter(parent=run).exists()


def test_adding_an_endpoint_says_when_the_roles_would_not_use_it(repo, settings, capsys):
    settings.PSYCHONAUTS_PROVIDER = ""
    call_command("endpoints", "add", "local", "--model", "qwen-coder")
    out = capsys.readouterr().out
    assert "scripted provider" in out and "ANNIHILATION_PROVIDER=openai" in out

    settings.PSYCHONAUTS_PROVIDER = "openai"
    call_command("endpoints", "add", "other", "--model", "qwen-coder")
    assert "ANNIHILATION_PROVIDER" not in capsys.readouterr().out
