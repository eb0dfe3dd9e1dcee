"""The registry of model endpoints: routing by tier among the healthy ones, failover of a failed
run's retry, the health beat marking down and back up, the in-flight limit across processes,
prices, and `manage.py endpoints`. Real agent runs through `agent_run_execute`, the real SDK
against local fake OpenAI-compatible servers, real Postgres and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from bursts.services.agent_runs import agent_run_next_attempt
from core.models import Event
from psychonauts.models import Endpoint, Role, Usage
from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import (
    EndpointInvalid,
    endpoint_add,
    endpoint_down,
    endpoint_mark_down,
    endpoints_failing,
    registry_snapshot,
)
from psychonauts.routing.providers.base import RunInfo
from psychonauts.routing.semaphore import slot_try_acquire
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.oneshot import role_complete
from psychonauts.tasks import endpoints_health
from tests.fakes.anthropic_server import FakeReply as AnthropicReply
from tests.fakes.anthropic_server import fake_anthropic_server
from tests.fakes.openai_server import FakeReply, fake_openai_server

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh(settings, redis_client, monkeypatch):
    settings.ENDPOINTS_CACHE_S = 0
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    settings.AUTOPILOT_ENDPOINT_FAILURES = 3
    # The key variables these tests name, besides the default list.
    settings.ENDPOINTS_KEY_ENVS = [
        *settings.ENDPOINTS_KEY_ENVS,
        "GATEWAY_TOKEN",
        "CLAUDE_GATEWAY_KEY",
        "NOT_SET_ANYWHERE",
    ]
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    endpoints._reset_at.clear()
    endpoints.registry_invalidate()
    yield
    endpoints.registry_invalidate()


def _execute(make_run, quantum, **fields):
    run = make_run("planner", quantum=quantum, provider="openai", **fields)
    outcome = agent_run_execute(agent_run_id=run.pk)
    run.refresh_from_db()
    return run, outcome


def _started(run):
    """The run's `started` event (the latest of its agent: attempts share the topic)."""
    return Event.objects.filter(topic=f"agent:{run.agent_id}", type="started").latest("id")


def test_it_routes_a_run_to_an_endpoint_of_its_tier(repo, make_quantum, make_run):
    with (
        fake_openai_server([FakeReply(text="small")]) as small,
        fake_openai_server([FakeReply(text="medium")]) as medium,
    ):
        endpoint_add(name="small", model="qwen:1b", base_url=small.base_url, tier="trivial")
        endpoint_add(name="medium", model="qwen:7b", base_url=medium.base_url, tier="standard")
        run, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "done", outcome.error
    assert outcome.result == "medium"
    assert (run.provider, run.model) == ("openai", "qwen:7b")
    assert [r["model"] for r in medium.requests] == ["qwen:7b"]
    assert small.requests == []


def test_a_failed_runs_retry_goes_to_another_endpoint_of_the_tier(repo, make_quantum, make_run):
    garbage = FakeReply(raw="data: <html>502 Bad Gateway</html>\n\n")
    with fake_openai_server([garbage]) as a, fake_openai_server([FakeReply(text="Fine.")]) as b:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        endpoint_add(name="gpu-b", model="llama3", base_url=b.base_url)
        quantum = make_quantum("Add a greeting", complexity="standard")
        first, outcome = _execute(make_run, quantum)

        assert outcome.status == "error"
        assert "not JSON" in outcome.error and "502 Bad Gateway" in outcome.error
        assert _started(first).payload["endpoint"] == "gpu-a"

        agent_run_next_attempt(agent=first)
        retry = type(first).objects.get(agent_id=first.agent_id, attempt=2)
        assert (retry.provider, retry.model) == ("openai", "llama3")  # copied from the first
        second = agent_run_execute(agent_run_id=retry.pk)

    assert second.status == "done", second.error
    assert second.result == "Fine."
    assert _started(retry).payload["endpoint"] == "gpu-b"
    assert len(a.requests) == 1 and len(b.requests) == 1
    failing = {(h.provider, h.model): h.failures for h in endpoints.endpoints_failing()}
    assert failing == {}  # one failure: under the healing's threshold
    assert int(redis_client_hget("openai|gpu-a")) == 1


def redis_client_hget(field: str) -> str:
    from core.redis import get_redis

    return str(get_redis().hget(endpoints.FAILURES_KEY, field) or 0)


def test_a_hanging_endpoint_times_out_and_fails_the_run_with_the_reason(
    repo, make_quantum, make_run, settings
):
    settings.ENDPOINTS_TIMEOUT_S = 0.3
    settings.AUTOPILOT_ENDPOINT_FAILURES = 1
    with fake_openai_server([FakeReply(text="slow", hang_s=2)]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        _, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "error"
    assert "timed out waiting for the endpoint" in outcome.error
    # The autopilot's healing reads the failure under the endpoint's name and marks it down.
    [failing] = endpoints_failing()
    assert (failing.provider, failing.model, failing.failures) == ("openai", "gpu-a", 1)


def test_every_endpoint_of_the_tier_failing_fails_the_retry_with_the_reason(
    repo, make_quantum, make_run
):
    with (
        fake_openai_server([FakeReply(status=400)]) as a,
        fake_openai_server([FakeReply(status=400)]) as b,
    ):
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        endpoint_add(name="gpu-b", model="llama3", base_url=b.base_url)
        quantum = make_quantum("Add a greeting", complexity="standard")
        first, _ = _execute(make_run, quantum)
        agent_run_next_attempt(agent=first)
        retry = type(first).objects.get(agent_id=first.agent_id, attempt=2)
        outcome = agent_run_execute(agent_run_id=retry.pk)

    assert outcome.status == "error"
    assert "HTTP 400 from llama3" in outcome.error
    assert len(a.requests) == 1 and len(b.requests) == 1


def test_a_down_endpoint_is_skipped_and_a_down_tier_falls_back_up(repo, make_quantum, make_run):
    with (
        fake_openai_server([FakeReply(text="never")]) as small,
        fake_openai_server([FakeReply(text="medium")]) as medium,
    ):
        endpoint_add(name="small", model="qwen:1b", base_url=small.base_url, tier="trivial")
        endpoint_add(name="medium", model="qwen:7b", base_url=medium.base_url, tier="standard")
        endpoint_mark_down(provider="openai", model="small", reason="test", ttl_s=60)
        run, outcome = _execute(make_run, make_quantum("Fix a typo", complexity="trivial"))

    assert outcome.status == "done", outcome.error
    assert run.model == "qwen:7b"
    assert small.requests == []
    routed = Event.objects.get(topic=f"agent:{run.agent_id}", type="routed")
    assert (
        "every endpoint of tier trivial is down; routed to tier standard" in routed.payload["note"]
    )


def test_a_small_local_model_gets_only_its_tier_and_only_while_it_is_up(
    repo, make_quantum, make_run, monkeypatch, settings
):
    """The README's example: one local model registered with `--tier trivial`. A complex
    quantum and a run naming another provider are not sent to it, and a trivial quantum is not
    sent to it while it is down: they are routed as without a registry, and say why."""
    settings.PSYCHONAUTS_MODELS = {
        **settings.PSYCHONAUTS_MODELS,
        "complex": "big",
        "trivial": "tiny",
    }
    with (
        fake_openai_server(lambda body: FakeReply(text="local")) as local,
        fake_openai_server(lambda body: FakeReply(text="env")) as env,
        fake_anthropic_server(lambda body: AnthropicReply(text="anthropic")) as claude,
    ):
        endpoint_add(name="local", model="qwen:1b", base_url=local.base_url, tier="trivial")
        monkeypatch.setenv("OPENAI_BASE_URL", env.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")

        complex_run, outcome = _execute(make_run, make_quantum("Redesign", complexity="complex"))
        assert (outcome.status, outcome.result, complex_run.model) == ("done", "env", "big")

        explicit = make_run(
            "planner", quantum=make_quantum("Fix it", complexity="trivial"), provider="anthropic"
        )
        outcome = agent_run_execute(agent_run_id=explicit.pk)
        assert (outcome.status, outcome.result) == ("done", "anthropic")

        trivial, outcome = _execute(make_run, make_quantum("Fix a typo", complexity="trivial"))
        assert (outcome.status, outcome.result) == ("done", "local")
        assert _started(trivial).payload["route"] == (
            "endpoint local of tier trivial, provider openai named"
        )

        endpoint_mark_down(provider="openai", model="local", reason="test", ttl_s=60)
        down, outcome = _execute(make_run, make_quantum("Fix a typo", complexity="trivial"))
        assert (outcome.status, outcome.result, down.model) == ("done", "env", "tiny")

    assert len(local.requests) == 1
    # The route and why, on each run.
    assert _started(complex_run).payload["route"] == "the complex tier's model (settings)"
    assert _started(explicit).payload["route"] == "the trivial tier's model (settings)"
    note = Event.objects.get(topic=f"agent:{down.agent_id}", type="routed").payload["note"]
    assert note == "every registry endpoint for it is down (local); routed by the settings"


def test_a_run_that_finds_its_endpoint_full_goes_to_another_of_the_tier(
    repo, make_quantum, make_run
):
    with (
        fake_openai_server([FakeReply(text="a")]) as a,
        fake_openai_server([FakeReply(text="b")]) as b,
    ):
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url, max_concurrency=1)
        endpoint_add(name="gpu-b", model="llama3", base_url=b.base_url, max_concurrency=1)
        assert slot_try_acquire("someone-else", limit=1, key=endpoints.SLOTS_PREFIX + "gpu-a")
        _, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "done", outcome.error
    assert outcome.result == "b"
    assert a.requests == []


def test_it_routes_as_without_a_registry_when_every_endpoint_is_disabled(
    repo, make_quantum, make_run, monkeypatch
):
    with fake_openai_server([FakeReply(text="env")]) as env, fake_openai_server([]) as off:
        endpoint_add(name="off", model="qwen:7b", base_url=off.base_url, enabled=False)
        monkeypatch.setenv("OPENAI_BASE_URL", env.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        run, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "done", outcome.error
    assert run.model == "claude-sonnet-4-6"  # PSYCHONAUTS_MODELS, as without a registry
    assert off.requests == []


def test_the_endpoints_price_feeds_the_cost_of_its_model(repo, make_quantum, make_run):
    reply = FakeReply(text="ok", tokens_in=1000, tokens_out=500)
    with fake_openai_server([reply]) as a:
        endpoint_add(
            name="gw", model="mixtral", base_url=a.base_url, usd_per_mtok_in=2, usd_per_mtok_out=4
        )
        run, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "done", outcome.error
    usage = Usage.objects.get(agent_run=run)
    assert float(usage.cost_usd) == pytest.approx((1000 * 2 + 500 * 4) / 1e6)


def test_the_key_is_read_from_the_named_environment_variable(
    repo, make_quantum, make_run, monkeypatch
):
    monkeypatch.setenv("GATEWAY_TOKEN", "s3cret-token-value")
    with fake_openai_server([FakeReply(text="ok")]) as a:
        endpoint_add(name="gw", model="m", base_url=a.base_url, api_key_env="GATEWAY_TOKEN")
        _, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "done", outcome.error
    assert a.headers[0]["authorization"] == "Bearer s3cret-token-value"
    row = Endpoint.objects.get(name="gw")
    assert "s3cret" not in json.dumps([str(v) for v in row.__dict__.values()])


def test_an_anthropic_endpoint_of_the_registry_gets_its_runs(
    repo, make_quantum, make_run, monkeypatch
):
    monkeypatch.setenv("CLAUDE_GATEWAY_KEY", "gw-key")
    with fake_anthropic_server([AnthropicReply(text="from claude")]) as fake:
        endpoint_add(
            name="claude-gw", provider="anthropic", model="claude-sonnet-4-6",
            base_url=fake.base_url, api_key_env="CLAUDE_GATEWAY_KEY",
        )  # fmt: skip
        quantum = make_quantum("Add a greeting", complexity="standard")
        run = make_run("planner", quantum=quantum, provider="anthropic")
        outcome = agent_run_execute(agent_run_id=run.pk)
        run.refresh_from_db()

    assert outcome.status == "done", outcome.error
    assert outcome.result == "from claude"
    assert (run.provider, run.model) == ("anthropic", "claude-sonnet-4-6")
    assert fake.requests[0]["model"] == "claude-sonnet-4-6"


# --- the health beat ----------------------------------------------------------------------------


def test_the_health_beat_marks_an_endpoint_down_with_the_reason_and_back_up(
    repo, make_quantum, make_run
):
    with (
        fake_openai_server([], models=["llama3"]) as a,
        fake_openai_server(lambda body: FakeReply(text="b"), models=["llama3"]) as b,
    ):
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        endpoint_add(name="gpu-b", model="llama3", base_url=b.base_url)
        assert endpoints_health() == 0
        assert Endpoint.objects.get(name="gpu-a").health == "up"
        assert a.requests == []  # an endpoint that is up is asked for its models only

        a.models_status = 500
        assert endpoints_health() == 1
        row = Endpoint.objects.get(name="gpu-a")
        assert (row.health, row.checked_at is not None) == ("down", True)
        assert "500" in row.health_reason
        assert endpoint_down("openai", "gpu-a")

        run, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))
        assert outcome.status == "done", outcome.error
        assert _started(run).payload["endpoint"] == "gpu-b"

        a.models_status = 200
        a._replies = [FakeReply(text="o")]  # the check's one-token request
        assert endpoints_health() == 0

    assert Endpoint.objects.get(name="gpu-a").health == "up"
    assert Endpoint.objects.get(name="gpu-a").health_reason == ""
    assert not endpoint_down("openai", "gpu-a")
    [probe] = a.requests  # coming back took a real answer
    assert probe["max_tokens"] == 1 and probe["model"] == "llama3"


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        pytest.param({"models_raw": "<html>gateway</html>"}, "", id="garbage"),
        pytest.param({"models": ["mistral", "phi3"]}, "'llama3' is not served", id="not-served"),
    ],
)
def test_the_health_check_finds_what_is_wrong(breakage, reason):
    with fake_openai_server([], models=["llama3"]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        for name, value in breakage.items():
            setattr(a, name, value)
        assert endpoints_health() == 1

    row = Endpoint.objects.get(name="gpu-a")
    assert row.health == "down"
    assert reason in row.health_reason and row.health_reason


def test_an_endpoint_runs_failed_on_gets_a_real_request_and_garbage_marks_it_down(
    redis_client,
):
    with fake_openai_server([FakeReply(raw="<html>oops</html>")], models=["llama3"]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        assert endpoints_health() == 0  # the models list is fine
        assert a.requests == []
        redis_client.hset(endpoints.FAILURES_KEY, "openai|gpu-a", 1)  # a run failed on it
        assert endpoints_health() == 1

    [probe] = a.requests
    assert probe["max_tokens"] == 1
    row = Endpoint.objects.get(name="gpu-a")
    assert row.health == "down" and row.health_reason
    assert endpoint_down("openai", "gpu-a")


def test_a_check_of_an_endpoint_that_is_up_keeps_its_failures_in_a_row(redis_client):
    with fake_openai_server([FakeReply(text="o")], models=["llama3"]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        redis_client.hset(endpoints.FAILURES_KEY, "openai|gpu-a", 2)
        assert endpoints_health() == 0

    assert redis_client.hget(endpoints.FAILURES_KEY, "openai|gpu-a") == "2"


def test_a_hanging_or_missing_endpoint_is_down(settings):
    settings.ENDPOINTS_HEALTH_TIMEOUT_S = 0.3
    with fake_openai_server([FakeReply(delay_s=3)]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url)
        endpoint_mark_down(provider="openai", model="gpu-a", reason="earlier", ttl_s=60)
        endpoint_add(name="gone", model="llama3", base_url="http://127.0.0.1:9/v1")
        endpoint_add(name="keyless", model="m", base_url=a.base_url, api_key_env="NOT_SET_ANYWHERE")
        assert endpoints_health() == 3

    reasons = dict(Endpoint.objects.values_list("name", "health_reason"))
    assert "timed out" in reasons["gpu-a"]
    assert "connect" in reasons["gone"].lower()
    assert reasons["keyless"] == "the environment variable NOT_SET_ANYWHERE is not set"


# --- the in-flight limit ------------------------------------------------------------------------

_CALLER = """
import json, os, sys, threading
import django
django.setup()
from psychonauts.routing.endpoints import EndpointConf, endpoint_provider
from psychonauts.routing.providers.base import ProviderRequest, RunInfo

conf = EndpointConf(**json.loads(sys.argv[1]))
provider = endpoint_provider(conf)
errors = []

def call(i):
    run = RunInfo(agent_run_id=os.getpid() * 100 + i, agent_id="a", role="r", attempt=1,
                  quantum_id=1)
    request = ProviderRequest(model=conf.model, system="", tools=[], max_tokens=5, run=run,
                              messages=[{"role": "user", "content": "hi"}])
    try:
        provider.complete(request, lambda text: None)
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(errors))
"""


def test_the_in_flight_limit_holds_across_processes():
    with fake_openai_server(lambda body: FakeReply(text="ok", delay_s=0.3)) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url, max_concurrency=2)
        [conf] = registry_snapshot()
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "annihilation.settings",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        callers = [
            subprocess.Popen(
                [sys.executable, "-c", _CALLER, json.dumps(asdict(conf))],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [c.communicate(timeout=120)[0] for c in callers]

    assert [json.loads(o.strip().splitlines()[-1]) for o in outputs] == [[], []]
    assert len(a.requests) == 8
    assert a.max_in_flight == 2


def test_a_call_that_waits_too_long_for_a_slot_fails_without_counting_a_failure(
    repo, make_quantum, make_run, settings
):
    settings.ENDPOINTS_SLOT_WAIT_S = 0.2
    with fake_openai_server([FakeReply(text="never")]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url, max_concurrency=1)
        assert slot_try_acquire("someone-else", limit=1, key=endpoints.SLOTS_PREFIX + "gpu-a")
        _, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "error"
    assert "all 1 slots stayed busy" in outcome.error
    assert a.requests == []
    assert redis_client_hget("openai|gpu-a") == "0"


def test_a_slot_is_not_waited_for_past_the_run_s_time(repo, make_quantum, make_run, settings):
    settings.ENDPOINTS_SLOT_WAIT_S = 600
    Role.objects.filter(name="planner").update(timeout_s=1)
    with fake_openai_server([FakeReply(text="never")]) as a:
        endpoint_add(name="gpu-a", model="llama3", base_url=a.base_url, max_concurrency=1)
        assert slot_try_acquire("someone-else", limit=1, key=endpoints.SLOTS_PREFIX + "gpu-a")
        _, outcome = _execute(make_run, make_quantum("Add a greeting", complexity="standard"))

    assert outcome.status == "error"
    assert outcome.error.startswith("timeout: "), outcome.error
    assert "ran out while it waited for a slot of endpoint gpu-a" in outcome.error
    assert a.requests == []
    assert redis_client_hget("openai|gpu-a") == "0"  # not a failure of the endpoint


# --- adding, listing, removing ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"base_url": "ftp://x"}, "base_url", id="url"),
        pytest.param({"api_key_env": "sk-live-abcdef0123456789"}, "never the key", id="a-key"),
        pytest.param({"api_key_env": "MY KEY"}, "api_key_env: the NAME", id="env-name"),
        pytest.param({"tier": "huge"}, "tier", id="tier"),
        pytest.param({"provider": "bard"}, "provider", id="provider"),
        pytest.param({"max_concurrency": 0}, "max_concurrency", id="concurrency"),
        pytest.param({"name": "has space"}, "name", id="name"),
        pytest.param({"usd_per_mtok_in": -1}, "negative", id="price"),
        pytest.param({"base_url": "http://me:pw@localhost/v1"}, "no credentials", id="creds"),
    ],
)
def test_it_refuses_a_bad_endpoint_and_writes_nothing(fields, reason):
    with pytest.raises(EndpointInvalid, match=reason):
        endpoint_add(
            **{"name": "e", "model": "m", "base_url": "http://localhost:11434/v1", **fields}
        )
    assert not Endpoint.objects.exists()


def test_it_refuses_a_name_taken():
    endpoint_add(name="e", model="m")
    with pytest.raises(EndpointInvalid, match="exists"):
        endpoint_add(name="e", model="other")
    assert list(Endpoint.objects.values_list("model", flat=True)) == ["m"]


def test_the_command_adds_lists_checks_and_removes(capsys):
    with fake_openai_server([], models=["llama3.1:8b"]) as a:
        call_command(
            "endpoints", "add", "ollama", "--model", "llama3.1:8b", "--base-url", a.base_url,
            "--tier", "trivial", "--max-concurrency", "2", "--price-in", "0", "--json",
        )  # fmt: skip
        assert json.loads(capsys.readouterr().out) == {"name": "ollama", "added": True}

        call_command("endpoints", "check", "--json")
        [checked] = json.loads(capsys.readouterr().out)
        assert (checked["name"], checked["up"], checked["how"]) == ("ollama", True, "models")

        call_command("endpoints", "list", "--json")
        [listed] = json.loads(capsys.readouterr().out)
        assert listed["model"] == "llama3.1:8b"
        assert (listed["tier"], listed["max_concurrency"], listed["in_flight"]) == ("trivial", 2, 0)
        assert (listed["health"], listed["down"], listed["price_in"]) == ("up", False, 0.0)

        a.models_status = 503
        with pytest.raises(CommandError, match="1 endpoint"):
            call_command("endpoints", "check", "ollama")
        capsys.readouterr()

    call_command("endpoints", "remove", "ollama", "--json")
    assert json.loads(capsys.readouterr().out) == {
        "name": "ollama", "removed": True,
    }  # fmt: skip
    assert not Endpoint.objects.exists()
    assert not endpoint_down("openai", "ollama")


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["add", "x", "--model", "m", "--api-key-env", "sk-abcdefghijklmnopqrstuvwx"], "never"),
        (["add", "x", "--model", "m", "--base-url", "not a url"], "base_url"),
        (["add", "x", "--model", "m", "--price-in", "cheap"], "not a price"),
        (["remove", "nobody"], "no endpoint named"),
        (["check", "nobody"], "no endpoint named nobody"),
    ],
)
def test_the_command_refuses_bad_input_with_a_clear_error(argv, reason):
    with pytest.raises(CommandError, match=reason):
        call_command("endpoints", *argv)
    assert not Endpoint.objects.exists()


def test_a_one_off_call_of_a_role_goes_to_an_endpoint_of_the_standard_tier(settings):
    """The reflector's call (`role_complete`) is routed by the registry as a standard run is:
    the down endpoint of the tier is skipped."""
    settings.PSYCHONAUTS_PROVIDER = "openai"
    with (
        fake_openai_server([FakeReply(text="down")]) as down,
        fake_openai_server([FakeReply(text="lessons")]) as up,
        fake_openai_server([FakeReply(text="small")]) as small,
    ):
        endpoint_add(name="down", model="m:down", base_url=down.base_url, tier="standard")
        endpoint_add(name="up", model="m:up", base_url=up.base_url, tier="standard")
        endpoint_add(name="small", model="m:small", base_url=small.base_url, tier="trivial")
        endpoint_mark_down(provider="openai", model="down", reason="test", ttl_s=60)
        answer = role_complete(
            role="reflector",
            prompt="read this",
            run=RunInfo(
                agent_run_id=0, agent_id="reflect", role="reflector", attempt=1, quantum_id=0
            ),
        )

    assert answer.text == "lessons"
    assert [r["model"] for r in up.requests] == ["m:up"]
    assert down.requests == [] and small.requests == []
