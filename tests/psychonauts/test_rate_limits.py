"""Rate limits absorbed on every endpoint a run calls: the endpoint of a provider's own settings
(`--provider anthropic` with its environment, the openai provider of the settings) lowers its
concurrency on a 429 or 529 as a registry endpoint does; a retry-after longer than a worker
waits suspends the run, holding no worker slot, and the run resumes when the wait is over with
its turns kept and nothing repeated. Local fakes of the Anthropic and OpenAI APIs, real Postgres,
Redis and, for the slot, a real single-slot Celery worker."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from annihilation.celery import app
from bursts.models import AgentRun, AgentStatus
from psychonauts.executors.gateway import DUMMY_KEY, Gateway
from psychonauts.models import ToolCall
from psychonauts.routing import ratelimits
from psychonauts.routing.endpoints import settings_endpoint
from psychonauts.runtime.execute import agent_run_execute
from tests.bursts.conftest import Worker, worker_env
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server
from tests.fakes.openai_server import FakeReply as OpenAIReply
from tests.fakes.openai_server import fake_openai_server
from tests.polling import wait_for
from tests.tether.conftest import active_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def anthropic_env(monkeypatch, settings):
    def point(base_url: str) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    settings.PSYCHONAUTS_PROVIDER_RETRIES = 3
    return point


def _limit(provider: str, redis_client: Any) -> float | None:
    conf = settings_endpoint(provider)
    assert conf is not None
    value = redis_client.get(ratelimits.LIMIT_PREFIX + conf.name)
    return None if value is None else float(value)


def test_a_429_on_the_anthropic_settings_endpoint_lowers_its_concurrency(
    repo, make_run, anthropic_env, redis_client
):
    run = make_run("planner", provider="anthropic")
    replies = [FakeReply(status=429, error="rate_limit_error", retry_after="0.05"),
               FakeReply(text="APPROVE")]  # fmt: skip
    with fake_anthropic_server(replies) as fake:
        anthropic_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert len(fake.requests) == 2
    assert fake.requests[0]["messages"] == fake.requests[1]["messages"]
    # One call was in flight when it was refused: halved to 1 (not from the settings' 256),
    # then the good call added 1/1.
    assert _limit("anthropic", redis_client) == 2


def test_a_429_on_the_openai_settings_endpoint_lowers_its_concurrency(
    repo, make_run, settings, monkeypatch, redis_client
):
    settings.PSYCHONAUTS_PROVIDER = "openai"
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 3
    run = make_run("planner")
    answers = iter([OpenAIReply(status=429, retry_after="0.05"), OpenAIReply(text="APPROVE")])
    with fake_openai_server(lambda body: next(answers)) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert len(fake.requests) == 2  # not retried inside the SDK as well
    assert _limit("openai", redis_client) == 2


def test_the_last_refusal_ends_the_run_naming_how_often_it_was_refused(
    repo, make_run, anthropic_env, settings
):
    settings.ENDPOINTS_RATE_LIMIT_TRIES = 3
    run = make_run("planner", provider="anthropic")
    refusals = [FakeReply(status=429, error="rate_limit_error", retry_after="0")] * 5
    with fake_anthropic_server(refusals) as fake:
        anthropic_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "rate_limit_error" in outcome.error
    assert "refused for load 3 times in a row" in outcome.error
    assert len(fake.requests) == 3


def test_a_429_through_a_cli_agent_s_gateway_lowers_the_same_endpoint_s_concurrency(
    repo, make_run, anthropic_env, redis_client
):
    """A CLI agent's calls go through its gateway to the endpoint of the settings: the one a
    run of the anthropic provider calls, under the same name and limit."""
    run = make_run("coder", provider="anthropic")
    model = "claude-sonnet-4-6"
    message = {"model": model, "max_tokens": 10, "stream": True,
               "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    replies = [FakeReply(status=429, error="rate_limit_error", retry_after="7"),
               FakeReply(text="hello")]  # fmt: skip
    with fake_anthropic_server(replies) as fake:
        anthropic_env(fake.base_url)
        with Gateway(run, provider="claude-code", allowed_models=frozenset({model}),
                     wave=None) as gateway:  # fmt: skip
            refused = _gateway_post(gateway, message)
            assert (refused.status, refused.getheader("retry-after")) == (429, "7")
            assert _limit("anthropic", redis_client) == 1
            assert _gateway_post(gateway, message).status == 200

    assert _limit("anthropic", redis_client) == 2


def _gateway_post(gateway: Gateway, body: dict[str, Any]) -> http.client.HTTPResponse:
    """A request to the gateway over its unix socket, as the CLI in the sandbox sends it."""
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(gateway.socket))
    conn.request("POST", "/v1/messages", body=json.dumps(body).encode(),
                 headers={"content-type": "application/json", "x-api-key": DUMMY_KEY})  # fmt: skip
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


# --- a long retry-after -------------------------------------------------------------------------


def _agent(
    title: str, refusal: FakeReply, refused: threading.Event
) -> Callable[[dict[str, Any]], FakeReply | None]:
    """Replies for the agent whose quantum is `title`: a look around, then (the first time only)
    `refusal`, then its answer."""

    def reply(body: dict[str, Any]) -> FakeReply | None:
        if title not in json.dumps(body["messages"][0]):
            return None
        if len(body["messages"]) == 1:
            return FakeReply(text="Looking.", tool_uses=[("list_dir", {"path": "."})])
        if not refused.is_set():
            refused.set()
            return refusal
        return FakeReply(text="Done.")

    return reply


def test_a_long_retry_after_suspends_the_run_and_it_resumes_once_the_wait_is_over(
    repo, make_run, make_quantum, anthropic_env, settings, redis_client
):
    settings.ENDPOINTS_RETRY_AFTER_MAX_S = 0.5
    run = make_run("coder", quantum=make_quantum(title="Alpha: look around"), provider="anthropic")
    refused = threading.Event()
    reply = _agent("Alpha", FakeReply(status=529, retry_after="1"), refused)
    with fake_anthropic_server(lambda body: reply(body) or FakeReply(text="?")) as fake:
        anthropic_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

        assert outcome.status == "waiting", outcome.error
        assert "asked to wait 1s" in outcome.error
        run.refresh_from_db()
        assert run.status == AgentStatus.WAITING
        assert redis_client.zscore(ratelimits.RESUME_KEY, str(run.pk)) is not None
        woken = wait_for(
            lambda: ratelimits.rate_limit_resume_due(), timeout=10, what="the wait to be over"
        )
        assert woken == [run.pk]
        run.refresh_from_db()
        assert (run.status, run.worker) == (AgentStatus.RUNNING, "")
        assert redis_client.zscore(ratelimits.RESUME_KEY, str(run.pk)) is None
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert len(fake.requests) == 3  # the look, the refused call, the same call (answered)
    assert fake.requests[1] == fake.requests[2]
    assert ToolCall.objects.filter(agent_run=run).count() == 1  # its tool call not repeated


def test_a_run_refused_again_after_every_wait_ends_in_error(
    repo, make_run, anthropic_env, settings, redis_client
):
    settings.ENDPOINTS_RETRY_AFTER_MAX_S = 0.5
    settings.ENDPOINTS_RATE_LIMIT_TRIES = 2
    run = make_run("planner", provider="anthropic")
    refusals = [FakeReply(status=429, error="rate_limit_error", retry_after="1")] * 5
    with fake_anthropic_server(refusals) as fake:
        anthropic_env(fake.base_url)
        outcomes = []
        for _ in range(3):
            outcomes.append(agent_run_execute(agent_run_id=run.pk).status)
            redis_client.zadd(ratelimits.RESUME_KEY, {str(run.pk): 0})
            ratelimits.rate_limit_resume_due(agent_run_id=run.pk)

    assert outcomes == ["waiting", "waiting", "error"]
    assert len(fake.requests) == 3


# --- on a single-slot worker --------------------------------------------------------------------


@pytest.fixture
def one_slot_worker(repo: Path, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(**env: str) -> Worker:
        worker = Worker(
            env=worker_env(
                ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
                ANNIHILATION_HOME=str(tmp_path / "home"),
                ANNIHILATION_REPO=str(repo),
                ANNIHILATION_PROVIDER="",
                ANNIHILATION_TEXT_FLUSH_S="0",
                ANNIHILATION_RETRY_BASE_S="0.01",
                REDIS_URL=django_settings.REDIS_URL,
                ANTHROPIC_API_KEY="test-key",
                **env,
            ),
            tmp=tmp_path,
            name=f"ratelimits-{os.getpid()}",
            beat=False,  # the countdown task wakes the run, not the beat
            concurrency=1,
        ).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    connection.close()


def _status(run_id: int) -> str:
    return str(AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first())


@pytest.mark.slow
def test_on_a_one_slot_worker_a_run_waiting_out_a_rate_limit_leaves_the_slot_to_another(
    one_slot_worker, make_run, make_quantum
):
    refused = threading.Event()
    alpha = _agent("Alpha", FakeReply(status=429, error="rate_limit_error", retry_after="6"),
                   refused)  # fmt: skip

    def reply(body: dict[str, Any]) -> FakeReply:
        return alpha(body) or FakeReply(text="Done.")

    with fake_anthropic_server(reply) as fake:
        worker = one_slot_worker(
            ANTHROPIC_BASE_URL=fake.base_url, ANNIHILATION_ENDPOINTS_RETRY_AFTER_MAX_S="1"
        )
        first = make_run("coder", quantum=make_quantum(title="Alpha: look"), provider="anthropic")
        second = make_run("coder", quantum=make_quantum(title="Beta: look"), provider="anthropic")
        app.send_task("psychonauts.tasks.execute_agent_run", args=(first.pk,))
        wait_for(lambda: _status(first.pk) == AgentStatus.WAITING, what="the rate limit to hold it")
        app.send_task("psychonauts.tasks.execute_agent_run", args=(second.pk,))

        # The only slot runs the other agent to its end while the first waits.
        wait_for(lambda: _status(second.pk) == AgentStatus.DONE, what="the other run to finish")
        assert _status(first.pk) == AgentStatus.WAITING
        wait_for(lambda: active_tasks(worker) == 0, timeout=5, what="the slot to be free")

        wait_for(lambda: _status(first.pk) == AgentStatus.DONE, what="the first run to resume")

    mine = [r for r in fake.requests if "Alpha" in json.dumps(r["messages"][0])]
    assert len(mine) == 3  # the look, the refused call, the same call (answered)
    assert mine[1] == mine[2]  # the refused call asked again as it was
    assert ToolCall.objects.filter(agent_run=first).count() == 1
