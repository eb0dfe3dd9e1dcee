"""Routing of agent runs: a trivial quantum with mechanical steps runs without a model, every
other goes to the model of its complexity (or the one named), skipping a model that is down.
Real agent runs through `agent_run_execute` on a real repository; the model is the local fake
of the Messages API, so a request that should not be made would be seen."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from core.models import Event
from psychonauts.models import ToolCall, Usage
from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import endpoint_mark_down, endpoints_failing
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server

pytestmark = pytest.mark.django_db

MECHANICAL = "$ printf '1.1\\n' > VERSION\n$ cat VERSION"
MODELS = {"trivial": "model-small", "standard": "model-medium", "complex": "model-large"}


@pytest.fixture
def fake_env(monkeypatch, settings, redis_client):
    settings.PSYCHONAUTS_MODELS = dict(MODELS)
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    endpoints._reset_at.clear()

    def point(base_url: str) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    return point


def _run_on_fake(make_run, fake_env, quantum, replies=None, **run_fields):
    run = make_run("coder", quantum=quantum, provider="anthropic", **run_fields)
    with fake_anthropic_server(replies or [FakeReply(text="Done.")]) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)
    run.refresh_from_db()
    return run, outcome, fake.requests


def test_it_runs_a_trivial_mechanical_quantum_without_any_model_call(
    repo: Path, make_quantum, make_run, fake_env
):
    quantum = make_quantum("Bump the version", body=MECHANICAL)
    assert (quantum.complexity, quantum.complexity_auto) == ("trivial", True)

    run, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert requests == []  # the model was never asked
    assert (run.provider, run.model) == ("shell", "shell")
    calls = list(ToolCall.objects.filter(agent_run=run).order_by("id"))
    assert [(c.name, c.input["command"], c.is_error) for c in calls] == [
        ("shell", "printf '1.1\\n' > VERSION", False),
        ("shell", "cat VERSION", False),
    ]
    assert calls[1].output.startswith("exit 0") and "1.1" in calls[1].output
    shown = git("show", f"{branch_for(quantum.pk)}:VERSION", cwd=repo)
    assert shown.strip() == "1.1"
    usage = list(Usage.objects.filter(agent_run=run).values_list("provider", "model", "cost_usd"))
    assert usage and all(u == ("shell", "shell", Decimal(0)) for u in usage)
    assert "Ran 2 mechanical step(s)" in outcome.result


def test_it_runs_mechanical_steps_without_a_model_even_when_the_scripted_provider_is_set(
    repo: Path, make_quantum, make_run, settings
):
    settings.PSYCHONAUTS_PROVIDER = "scripted"
    quantum = make_quantum("Bump the version", body=MECHANICAL)
    run = make_run("coder", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert outcome.status == "done", outcome.error
    assert run.provider == "shell"


def test_it_keeps_the_scripted_provider_for_quanta_that_are_not_trivial(
    repo: Path, make_quantum, make_run, settings
):
    settings.PSYCHONAUTS_PROVIDER = "scripted"
    quantum = make_quantum("Bump the version", body=MECHANICAL, complexity="standard")
    run = make_run("planner", quantum=quantum)

    agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert (run.provider, run.model) == ("scripted", "scripted")


def test_it_sends_mechanical_steps_to_the_trivial_model_when_the_setting_is_off(
    repo: Path, make_quantum, make_run, fake_env, settings
):
    settings.PSYCHONAUTS_TRIVIAL_NO_LLM = False
    quantum = make_quantum("Bump the version", body=MECHANICAL)

    run, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == ["model-small"]
    assert (run.provider, run.model) == ("anthropic", "model-small")


@pytest.mark.parametrize(
    ("title", "fields", "model"),
    [
        pytest.param("Fix a typo in the greeting", {}, "model-small", id="trivial-auto"),
        pytest.param("Add a greeting", {}, "model-medium", id="standard-auto"),
        pytest.param("Refactor the greeting module", {}, "model-large", id="complex-auto"),
        pytest.param("Add a greeting", {"complexity": "complex"}, "model-large", id="complex-set"),
        pytest.param(
            "Bump it", {"body": MECHANICAL, "complexity": "standard"}, "model-medium",
            id="mechanical-but-standard",
        ),
    ],
)  # fmt: skip
def test_it_routes_each_complexity_to_its_model(
    repo: Path, make_quantum, make_run, fake_env, title, fields, model
):
    quantum = make_quantum(title, **fields)

    run, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == [model]
    assert (run.provider, run.model) == ("anthropic", model)


def test_a_model_named_by_the_run_wins_over_the_tier(repo: Path, make_quantum, make_run, fake_env):
    quantum = make_quantum("Refactor the greeting module")
    endpoint_mark_down(provider="anthropic", model="model-named", reason="test", ttl_s=60)

    _, outcome, requests = _run_on_fake(make_run, fake_env, quantum, model="model-named")

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == ["model-named"]


def test_it_skips_a_model_that_is_down_for_the_next_tier(
    repo: Path, make_quantum, make_run, fake_env
):
    quantum = make_quantum("Refactor the greeting module")
    endpoint_mark_down(provider="anthropic", model="model-large", reason="overloaded", ttl_s=60)

    run, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == ["model-medium"]
    note = Event.objects.get(topic=f"agent:{run.agent_id}", type="routed").payload["note"]
    assert note == "model-large is down; routed to model-medium"


def test_a_trivial_quantum_falls_back_up_when_its_model_is_down(
    repo: Path, make_quantum, make_run, fake_env
):
    quantum = make_quantum("Fix a typo in the greeting")
    endpoint_mark_down(provider="anthropic", model="model-small", reason="down", ttl_s=60)

    _, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == ["model-medium"]


def test_it_uses_the_tiers_model_and_says_so_when_every_model_is_down(
    repo: Path, make_quantum, make_run, fake_env
):
    quantum = make_quantum("Add a greeting")
    for model in MODELS.values():
        endpoint_mark_down(provider="anthropic", model=model, reason="down", ttl_s=60)

    run, outcome, requests = _run_on_fake(make_run, fake_env, quantum)

    assert outcome.status == "done", outcome.error
    assert [r["model"] for r in requests] == ["model-medium"]
    note = Event.objects.get(topic=f"agent:{run.agent_id}", type="routed").payload["note"]
    assert "every configured model is down" in note and "using model-medium" in note


def test_provider_failures_in_a_row_make_an_endpoint_failing_and_a_success_resets_it(
    repo: Path, make_quantum, make_run, fake_env, settings
):
    settings.AUTOPILOT_ENDPOINT_FAILURES = 2
    settings.ENDPOINTS_RATE_LIMIT_TRIES = 1  # one refusal for load ends the run
    overloaded = [FakeReply(status=529, error="overloaded_error")]
    for n in (1, 2):
        _, outcome, _ = _run_on_fake(make_run, fake_env, make_quantum(), list(overloaded))
        assert outcome.status == "error"
        failing = endpoints_failing()
        assert [(e.provider, e.model, e.failures) for e in failing] == (
            [] if n == 1 else [("anthropic", "model-medium", 2)]
        )
    assert failing[0].down_until is None

    _, outcome, _ = _run_on_fake(make_run, fake_env, make_quantum())

    assert outcome.status == "done", outcome.error
    assert endpoints_failing() == []


def test_a_trivial_quantum_without_mechanical_steps_on_the_scripted_provider_stays_scripted(
    repo: Path, make_quantum, make_run
):
    quantum = make_quantum("Fix a typo in the greeting")
    run = make_run("planner", quantum=quantum)

    agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert (run.provider, run.model) == ("scripted", "scripted")


def test_an_epic_is_never_run_as_mechanical_steps(repo: Path, make_quantum, make_run):
    quantum = make_quantum("Bump the version", body=MECHANICAL, kind="epic")
    assert quantum.complexity == "trivial"
    run = make_run("planner", quantum=quantum)

    agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert run.provider == "scripted"
