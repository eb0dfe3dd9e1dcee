"""The openai provider through the real SDK against a local fake OpenAI-compatible server whose
streams are awkward but valid (tool-call arguments in fragments of a character or three,
keep-alive comments, usage in a last chunk without choices)."""

from __future__ import annotations

import pytest

from bursts.models import AgentStatus
from psychonauts.models import ToolCall, Usage
from psychonauts.routing import endpoints
from psychonauts.routing.providers.openai import to_openai_messages, to_openai_tools
from psychonauts.runtime.execute import agent_run_execute
from tests.fakes.openai_server import FakeReply, fake_openai_server

pytestmark = pytest.mark.django_db

MODELS = {"trivial": "local-small", "standard": "local-medium", "complex": "local-large"}


@pytest.fixture
def fake_env(monkeypatch, settings, redis_client):
    settings.PSYCHONAUTS_MODELS = dict(MODELS)
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 3
    settings.PSYCHONAUTS_PRICES = {**settings.PSYCHONAUTS_PRICES, "local-medium": (0.5, 1.5)}
    endpoints._reset_at.clear()

    def point(base_url: str) -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    return point


def test_it_streams_a_text_answer_and_records_usage(repo, make_run, fake_env):
    run = make_run("planner", provider="openai")
    deltas: list[str] = []
    reply = FakeReply(text="APPROVE\nLooks right to me.", tokens_in=1200, tokens_out=300)
    with fake_openai_server([reply]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(
            agent_run_id=run.pk,
            observer=lambda kind, data: deltas.append(data["text"]) if kind == "delta" else None,
        )

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("APPROVE")
    assert "".join(deltas) == "APPROVE\nLooks right to me."
    usage = Usage.objects.get(agent_run=run)
    assert (usage.provider, usage.model) == ("openai", "local-medium")
    assert (usage.tokens_in, usage.tokens_out) == (1200, 300)
    assert float(usage.cost_usd) == pytest.approx((1200 * 0.5 + 300 * 1.5) / 1e6)
    request = fake.requests[0]
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}
    assert request["model"] == "local-medium"
    assert request["messages"][0]["role"] == "system"
    assert any(t["function"]["name"] == "read_file" for t in request["tools"])
    assert fake.headers[0]["authorization"] == "Bearer test-key"


@pytest.mark.parametrize("fragment", [1, 3])
def test_it_assembles_tool_calls_streamed_in_tiny_fragments_and_sends_the_results_back(
    repo, make_run, fake_env, fragment
):
    run = make_run("coder", provider="openai")
    content = 'line "one"\nline two — ünïcode {"json": [1, 2]}\n'
    replies = [
        FakeReply(
            text="Writing two files.",
            tool_calls=[
                ("write_file", {"path": "a.txt", "content": content}),
                ("write_file", {"path": "b.txt", "content": "B"}),
            ],
            fragment=fragment,
        ),
        FakeReply(text="Done."),
    ]
    with fake_openai_server(replies) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    calls = list(ToolCall.objects.filter(agent_run=run).order_by("tool_use_id"))
    assert sorted((c.name, c.input["path"], c.is_error) for c in calls) == [
        ("write_file", "a.txt", False),
        ("write_file", "b.txt", False),
    ]
    assert {c.input["path"]: c.input["content"] for c in calls} == {"a.txt": content, "b.txt": "B"}
    second = fake.requests[1]["messages"]
    assistant = second[2]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Writing two files."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["write_file"] * 2
    results = [m for m in second if m["role"] == "tool"]
    assert {m["tool_call_id"] for m in results} == {c.tool_use_id for c in calls}
    assert all("wrote" in m["content"] for m in results)


@pytest.mark.parametrize(
    "failures",
    [
        pytest.param([FakeReply(status=429, retry_after="0")], id="429-then-success"),
        pytest.param([FakeReply(status=503, retry_after="0")] * 2, id="503-twice"),
        pytest.param([FakeReply(text="lost " * 50, cut=True)], id="stream-cut-half-way"),
    ],
)
def test_it_retries_then_succeeds(repo, make_run, fake_env, failures):
    run = make_run("planner", provider="openai")
    with fake_openai_server([*failures, FakeReply(text="OK")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert outcome.result == "OK"
    assert len(fake.requests) == len(failures) + 1


def test_it_ends_in_error_with_the_reason_after_the_last_retry(repo, make_run, fake_env, settings):
    settings.ENDPOINTS_RATE_LIMIT_TRIES = 3  # a refusal for load is the endpoint's to retry
    run = make_run("planner", provider="openai")
    with fake_openai_server([FakeReply(status=429, retry_after="0")] * 5) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "HTTP 429" in outcome.error
    assert len(fake.requests) == 3
    run.refresh_from_db()
    assert run.status == AgentStatus.ERROR
    assert run.error == outcome.error


def test_it_does_not_retry_a_bad_request(repo, make_run, fake_env):
    run = make_run("planner", provider="openai")
    with fake_openai_server([FakeReply(status=400)] * 3) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "HTTP 400" in outcome.error
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("data: {half an object\n\n", "a stream chunk is not JSON"),
        ('data: {"choices": [{"index": 0, "delta": {"content": 5}}]}\n\n', "malformed stream"),
        ('data: {"choices": 7}\n\n', "malformed stream"),
        ('data: ["a", "list"]\n\n', "malformed stream"),
        ('data: {"error": {"message": "model crashed"}}\n\n', "model crashed"),
        (
            'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, '
            '"function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}\n\n',
            "has no name",
        ),
    ],
)
def test_garbage_ends_the_run_in_error_with_the_reason(repo, make_run, fake_env, raw, reason):
    run = make_run("planner", provider="openai")
    with fake_openai_server([FakeReply(raw=raw), FakeReply(text="never asked")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert reason in outcome.error
    assert "internal error" not in outcome.error
    assert len(fake.requests) == 1  # not retried: the same answer would come back


def test_a_hang_times_out_and_ends_the_run_with_the_reason(repo, make_run, fake_env, settings):
    settings.ENDPOINTS_TIMEOUT_S = 0.3
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 2
    run = make_run("planner", provider="openai")
    with fake_openai_server([FakeReply(text="slow", hang_s=2)] * 2) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "timed out waiting for the endpoint after 2 attempts" in outcome.error
    assert len(fake.requests) == 2
    assert endpoints.endpoint_failure("openai", "local-medium") == 2  # the run counted one


def test_our_conversation_becomes_chat_messages_with_tool_calls_and_tool_results():
    messages = to_openai_messages(
        "be brief",
        [
            {"role": "user", "content": "fix it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "t2", "name": "list_dir", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "A", "is_error": False},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "no", "is_error": True},
                    {"type": "text", "text": "(2 turns left)"},
                ],
            },
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "x",
                                               "input": {}}]},
        ],
    )  # fmt: skip

    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "list_dir", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "A"},
        {"role": "tool", "tool_call_id": "t2", "content": "error: no"},
        {"role": "user", "content": "(2 turns left)"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t3", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ],
        },
    ]
    assert to_openai_tools(
        [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    ) == [
        {
            "type": "function",
            "function": {"name": "t", "description": "d", "parameters": {"type": "object"}},
        }
    ]
