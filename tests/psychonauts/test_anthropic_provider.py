"""The anthropic provider through the real SDK against a local fake of the streaming API."""

from __future__ import annotations

import threading
from typing import cast

import httpx2
import pytest

from bursts.models import AgentStatus
from psychonauts.models import Role, ToolCall, Usage
from psychonauts.runtime.execute import agent_run_execute
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server
from tests.polling import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake_env(monkeypatch, settings):
    def point(base_url: str) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    settings.PSYCHONAUTS_PROVIDER_RETRIES = 3
    return point


def test_it_streams_a_text_answer_and_records_usage(repo, make_run, fake_env):
    run = make_run("planner", provider="anthropic")
    deltas = []
    with fake_anthropic_server([FakeReply(text="APPROVE\nLooks right to me.", tokens_in=1200,
                                          tokens_out=300)]) as fake:  # fmt: skip
        fake_env(fake.base_url)
        outcome = agent_run_execute(
            agent_run_id=run.pk,
            observer=lambda kind, data: deltas.append(data["text"]) if kind == "delta" else None,
        )

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("APPROVE")
    assert "".join(deltas) == "APPROVE\nLooks right to me."
    usage = Usage.objects.get(agent_run=run)
    assert (usage.provider, usage.model) == ("anthropic", "claude-sonnet-4-6")
    assert (usage.tokens_in, usage.tokens_out) == (1200, 300)
    assert float(usage.cost_usd) == pytest.approx((1200 * 3 + 300 * 15) / 1e6)
    request = fake.requests[0]
    assert request["stream"] is True
    assert request["model"] == "claude-sonnet-4-6"
    assert any(t["name"] == "read_file" for t in request["tools"])


def test_it_runs_tool_calls_and_sends_their_results_back(repo, make_run, fake_env):
    run = make_run("coder", provider="anthropic")
    replies = [
        FakeReply(text="Writing.", tool_uses=[("write_file", {"path": "a.txt", "content": "A"})]),
        FakeReply(text="Done."),
    ]
    with fake_anthropic_server(replies) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    call = ToolCall.objects.get(agent_run=run)
    assert (call.name, call.input, call.is_error) == (
        "write_file",
        {"path": "a.txt", "content": "A"},
        False,
    )
    second = fake.requests[1]["messages"]
    assert second[1]["role"] == "assistant"
    result = second[2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == call.tool_use_id
    assert "wrote 1 characters" in result["content"]


@pytest.mark.parametrize(
    "failures",
    [
        pytest.param([FakeReply(error="overloaded_error"), FakeReply(status=529)], id="overloaded"),
        pytest.param([FakeReply(text="lost " * 50, cut=True)], id="stream-cut-half-way"),
    ],
)
def test_it_retries_then_succeeds(repo, make_run, fake_env, failures):
    run = make_run("planner", provider="anthropic")
    with fake_anthropic_server([*failures, FakeReply(text="OK")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert outcome.result == "OK"
    assert len(fake.requests) == len(failures) + 1


def test_it_ends_in_error_with_the_reason_after_the_last_retry(repo, make_run, fake_env, settings):
    settings.ENDPOINTS_RATE_LIMIT_TRIES = 3  # a refusal for load is the endpoint's to retry
    run = make_run("planner", provider="anthropic")
    with fake_anthropic_server([FakeReply(status=429, error="rate_limit_error")] * 5) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "rate_limit_error" in outcome.error
    assert "refused for load 3 times in a row" in outcome.error
    assert len(fake.requests) == 3
    run.refresh_from_db()
    assert run.status == AgentStatus.ERROR
    assert run.error == outcome.error


def test_it_does_not_retry_a_bad_request(repo, make_run, fake_env):
    run = make_run("planner", provider="anthropic")
    with fake_anthropic_server([FakeReply(status=400, error="invalid_request_error")] * 3) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("event: content_block_delta\ndata: {half an object\n\n", "a stream event is not JSON"),
        (
            'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
            '"content_block": {"type": "text", "text": 5}}\n\n',
            "malformed stream event",
        ),
        ('event: message_delta\ndata: {"type": "message_delta"}\n\n', "malformed stream event"),
    ],
)
def test_a_malformed_stream_ends_the_run_in_error_with_the_reason(
    repo, make_run, fake_env, frame, reason
):
    run = make_run("planner", provider="anthropic")
    with fake_anthropic_server([FakeReply(raw=frame), FakeReply(text="never asked")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert reason in outcome.error
    assert "internal error" not in outcome.error
    assert len(fake.requests) == 1  # not retried: the same answer would come back


def test_a_model_that_keeps_answering_is_stopped_when_the_run_s_time_runs_out(
    repo, make_run, fake_env
):
    # 150 events 50 ms apart: 7.5 s of answer against the role's 1 s.
    Role.objects.filter(name="coder").update(timeout_s=1)
    run = make_run("coder", provider="anthropic")
    with fake_anthropic_server([FakeReply(text="la " * 760, drip_s=0.05)]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)
        # The server sees the closed connection when it sends its next event.
        wait_for(lambda: fake.gave_up, timeout=5, what="the server to see the call given up")

    assert outcome.status == "error"
    assert outcome.error.startswith("timeout: "), outcome.error
    assert "was still answering when the run's time ran out" in outcome.error
    assert fake.gave_up == 1  # the answer was cut off, not read to its end


def test_it_stops_before_a_call_that_would_exceed_the_budget(repo, make_run, fake_env, settings):
    settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 0.01
    run = make_run("coder", provider="anthropic")
    replies = [
        FakeReply(text="Step.", tool_uses=[("list_dir", {})], tokens_in=2000, tokens_out=500),
        FakeReply(text="never sent"),
    ]
    with fake_anthropic_server(replies) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("budget:")
    assert len(fake.requests) == 1, "the second call was never made"
    assert Usage.objects.filter(agent_run=run).count() == 1


def _run_in_a_wave(make_run, make_quantum, *, wave_budget=None):
    from bursts.models import Burst, QuantumRun, Wave

    wave = Wave.objects.create(budget_usd=wave_budget)
    burst = Burst.objects.create(wave=wave, number=1)
    quantum = make_quantum()
    qrun = QuantumRun.objects.create(wave=wave, burst=burst, quantum=quantum, pipeline_name="p")
    run = make_run("coder", quantum=quantum, provider="anthropic")
    run.quantum_run = qrun
    run.save(update_fields=["quantum_run"])
    return wave, qrun, run


def _spent_elsewhere(run, *, quantum_run=None, wave=None, usd="0.5"):
    """Another agent's usage row (a sibling in the fan-out, or another run of the wave)."""
    Usage.objects.create(
        agent_run=run, quantum_run=quantum_run, wave=wave, provider="anthropic", model="m",
        cost_usd=usd,
    )  # fmt: skip


def test_the_budget_counts_what_other_agents_of_the_quantum_run_spent(
    repo, make_run, make_quantum, fake_env, settings
):
    settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 0.4
    wave, qrun, run = _run_in_a_wave(make_run, make_quantum)
    _spent_elsewhere(run, quantum_run=qrun, wave=wave)
    with fake_anthropic_server([FakeReply(text="never sent")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("budget: the quantum run has spent $0.5000")
    assert fake.requests == []


def test_the_wave_budget_counts_the_whole_wave(repo, make_run, make_quantum, fake_env, settings):
    settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 100
    wave, _qrun, run = _run_in_a_wave(make_run, make_quantum, wave_budget="1.0")
    _spent_elsewhere(run, wave=wave, usd="1.0")  # another quantum run of the same wave
    with fake_anthropic_server([FakeReply(text="never sent")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith(f"budget: wave {wave.pk} has spent $1.0000 of $1.0000")
    assert fake.requests == []


def test_a_wave_under_budget_runs_and_records_its_turns(
    repo, make_run, make_quantum, fake_env, settings
):
    wave, qrun, run = _run_in_a_wave(make_run, make_quantum, wave_budget="1.0")
    _spent_elsewhere(run, wave=wave, usd="0.2")
    replies = [
        FakeReply(text="Looking.", tool_uses=[("list_dir", {})], tokens_in=100, tokens_out=10),
        FakeReply(text="fine", tokens_in=200, tokens_out=20),
    ]
    with fake_anthropic_server(replies) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert len(fake.requests) == 2
    usage = list(
        Usage.objects.filter(agent_run=run, quantum_run=qrun, wave=wave)
        .order_by("pk")
        .values_list("tokens_in", "tokens_out", "provider")
    )
    assert usage == [(100, 10, "anthropic"), (200, 20, "anthropic")]
    run.refresh_from_db()
    assert (run.tokens_in, run.tokens_out, run.phase) == (300, 30, "done")
    assert run.cost_usd == sum(u.cost_usd for u in Usage.objects.filter(quantum_run=qrun))
    turns = list(run.turns.order_by("index"))
    assert [(t.index, t.complete, t.stop_reason) for t in turns] == [
        (0, True, "tool_use"),
        (1, True, "end_turn"),
    ]
    call = ToolCall.objects.get(agent_run=run)
    assert (call.name, call.turn_index, call.completed, call.is_error) == (
        "list_dir",
        0,
        True,
        False,
    )
    assert turns[0].tool_results[0]["tool_use_id"] == call.tool_use_id
    assert turns[0].tool_results[0]["content"] == call.output


def test_text_streamed_after_a_slow_start_goes_out_whole_with_the_checkpoint(
    repo, make_run, fake_env, settings
):
    # The model thinks longer than the flush interval, then streams its answer in 16-character
    # deltas within milliseconds: one text event with all of it, not the first delta alone.
    from core.models import Event

    settings.PSYCHONAUTS_TEXT_FLUSH_S = 0.2
    text = "A careful answer that arrives in several deltas."
    run = make_run("planner", provider="anthropic")
    with fake_anthropic_server([FakeReply(text=text, delay_s=0.3)]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    texts = Event.objects.filter(topic=f"agent:{run.agent_id}", type="text")
    assert [e.payload["text"] for e in texts] == [text]


def test_a_process_loads_tls_certificates_once_for_all_its_clients(monkeypatch):
    # Loading them costs ~25 ms of CPU; the first burst on a fresh worker made every shard's
    # client at once. Each client (connection pool) of the process's shards shares the context.
    from psychonauts.routing.providers import anthropic as provider

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://llm.test.invalid")
    monkeypatch.setattr(provider, "_clients", {})
    clients = []
    for _ in range(provider.CLIENT_SHARDS):
        thread = threading.Thread(target=lambda: clients.append(provider.shared_client()))
        thread.start()
        thread.join()
    assert len({id(c) for c in clients}) == provider.CLIENT_SHARDS
    transports = [c._client._transport for c in clients]
    assert all(isinstance(t, httpx2.HTTPTransport) for t in transports)
    contexts = {id(cast(httpx2.HTTPTransport, t)._pool._ssl_context) for t in transports}
    assert contexts == {id(provider._tls_context())}


def test_a_warmed_process_has_every_shard_client_before_its_first_agent(monkeypatch):
    from psychonauts.routing.providers import anthropic as provider

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://llm.test.invalid")
    monkeypatch.setattr(provider, "_clients", {})
    assert provider.shared_clients_warm() == provider.CLIENT_SHARDS
    made = dict(provider._clients)

    clients = []
    thread = threading.Thread(target=lambda: clients.append(provider.shared_client()))
    thread.start()
    thread.join()
    assert provider._clients == made  # the agent's thread took one of them
    assert any(c is clients[0] for c in made.values())
    assert provider.shared_clients_warm() == 0


def test_without_a_key_no_client_is_made_ahead(monkeypatch):
    from psychonauts.routing.providers import anthropic as provider

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setattr(provider, "_clients", {})
    assert provider.shared_clients_warm() == 0
    assert provider._clients == {}
