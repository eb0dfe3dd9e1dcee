"""Spend you can see: each agent's calls, tokens, cache share and cost, and a model whose price
nobody gave shown as of unknown price rather than billed at another model's. Real agent runs
against local fakes of the model APIs."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from core.access import operator_ensure
from psychonauts.models import Usage
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.selectors import agent_spend
from tests.fakes.anthropic_server import FakeReply, PromptCache, fake_anthropic_server
from tests.fakes.openai_server import FakeReply as OpenAIReply
from tests.fakes.openai_server import fake_openai_server

pytestmark = pytest.mark.django_db


def test_an_unknown_models_calls_are_of_unknown_price(repo, make_run, monkeypatch, client):
    """A local model neither the registry nor PSYCHONAUTS_PRICES prices costs nothing the
    ledger invents: its calls are recorded unpriced and shown so."""
    run = make_run("planner", provider="openai", model="qwen2.5-coder-1.5b")
    with fake_openai_server([OpenAIReply(text="OK", tokens_in=5000, tokens_out=400)]) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        assert agent_run_execute(agent_run_id=run.pk).status == "done"

    usage = Usage.objects.get(agent_run=run)
    assert (usage.priced, usage.cost_usd, usage.tokens_in) == (False, Decimal(0), 5000)
    run.refresh_from_db()
    assert run.cost_usd == 0
    spend = agent_spend(agent_run_id=run.pk)
    assert (spend["calls"], spend["unpriced"], spend["cost"]) == (1, 1, "price unknown")
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    page = client.get(reverse("focus", args=[run.pk]))
    assert page.status_code == 200, (page.status_code, page.headers)
    assert "price unknown" in page.content.decode()


def test_focus_shows_an_agents_tokens_cache_share_and_cost(repo, make_run, monkeypatch, client):
    run = make_run("coder", provider="anthropic")
    replies = [FakeReply(tool_uses=[("read_file", {"path": "README.md"})]), FakeReply(text="Done.")]
    with fake_anthropic_server(replies, cache=PromptCache()) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        assert agent_run_execute(agent_run_id=run.pk).status == "done"

    spend = agent_spend(agent_run_id=run.pk)
    rows = list(Usage.objects.filter(agent_run=run))
    assert spend["calls"] == 2 and spend["unpriced"] == 0
    assert spend["cache_read"] == sum(u.cache_read_tokens for u in rows) > 0
    assert spend["cost_usd"] == sum(u.cost_usd for u in rows)
    assert spend["cache_share"] is not None and 0 < spend["cache_share"] < 1
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    html = client.get(reverse("focus", args=[run.pk])).content.decode()
    assert f"<b>${spend['cost_usd']:.4f}</b>" in html
    assert f"{spend['cache_read']} read from cache" in html


def test_psychonaut_agents_lists_each_agents_tokens_cache_share_and_cost(make_run):
    priced, local = make_run("coder"), make_run("planner")
    Usage.objects.create(
        agent_run=priced, provider="anthropic", model="claude-sonnet-4-6", tokens_in=100,
        cache_read_tokens=900, tokens_out=50, cost_usd=Decimal("0.0012"),
    )  # fmt: skip
    Usage.objects.create(
        agent_run=local, provider="openai", model="qwen", tokens_in=700, tokens_out=20,
        priced=False,
    )  # fmt: skip
    out = StringIO()
    call_command("psychonaut", "agents", "--rebuild", stdout=out)

    rows = {line.split()[0]: line for line in out.getvalue().splitlines()[3:]}
    assert rows[str(priced.pk)].split()[-3:] == ["1000/50", "90%", "$0.0012"]
    assert rows[str(local.pk)].split()[-4:] == ["700/20", "0%", "price", "unknown"]


def test_the_wave_page_shows_its_spend_by_role_and_its_projected_cost(make_quantum, client):
    from bursts.models import AgentRun, Burst, QuantumRun, Wave

    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    usd = {"coder": Decimal("0.3000"), "reviewer": Decimal("0.1000")}
    for n, status in enumerate(("done", "running", "pending", "pending")):
        quantum = make_quantum(f"q{n}")
        run = QuantumRun.objects.create(
            wave=wave, burst=burst, quantum=quantum, status=status, pipeline_name="default"
        )
        if status != "done":
            continue
        for role, cost in usd.items():
            agent = AgentRun.objects.create(
                agent_id=f"{quantum.pk}_s0_{role}", quantum=quantum, quantum_run=run, role=role
            )
            Usage.objects.create(
                agent_run=agent, quantum_run=run, wave=wave, provider="anthropic",
                model="claude-sonnet-4-6", tokens_in=100, cache_read_tokens=300,
                tokens_out=10, cost_usd=cost,
            )  # fmt: skip

    client.force_login(operator_ensure(username="op", password="pw-operator"))
    html = client.get(reverse("wave", args=[wave.pk])).content.decode()

    # $0.40 for the one finished run of four: $1.60 projected.
    assert '<b id="wave-projected">$1.6000</b> for its 4 quantum runs (1 finished)' in html
    assert '<tr id="wave-spend-coder"><td>coder</td><td class="num">1</td>' in html
    assert '<td class="num">$0.3000</td>' in html and '<td class="num">$0.1000</td>' in html
    assert "cache share 75%" in html


def test_psychonaut_agents_json_carries_each_agents_spend(make_run):
    run = make_run("coder")
    Usage.objects.create(
        agent_run=run, provider="anthropic", model="claude-sonnet-4-6", tokens_in=10,
        cache_write_tokens=30, tokens_out=5, cost_usd=Decimal("0.0002"),
    )  # fmt: skip
    out = StringIO()
    call_command("psychonaut", "agents", "--rebuild", "--json", stdout=out)

    [entry] = [e for e in json.loads(out.getvalue()) if e["agent_run_id"] == run.pk]
    assert entry["spend"]["cache_write"] == 30
    assert entry["spend"]["cost"] == "$0.0002"


def test_the_quantum_page_shows_what_its_agents_spent(make_quantum, make_run, client):
    quantum = make_quantum()
    for role, cost in (("coder", "0.0100"), ("reviewer", "0.0050")):
        Usage.objects.create(
            agent_run=make_run(role, quantum=quantum), provider="anthropic",
            model="claude-sonnet-4-6", tokens_in=200, cache_read_tokens=600, tokens_out=20,
            cost_usd=Decimal(cost),
        )  # fmt: skip
    Usage.objects.create(agent_run=make_run("coder"), provider="x", model="y", tokens_in=999)

    client.force_login(operator_ensure(username="op", password="pw-operator"))
    html = client.get(reverse("quantum", args=[quantum.pk])).content.decode()

    assert (
        '<p id="quantum-spend" class="muted">spend: 2 model calls · 1600 tokens in, 75% from '
        "cache · 40 out · <b>$0.0150</b></p>"
    ) in html


def test_the_goal_page_shows_what_the_agents_of_its_epic_and_quanta_spent(
    make_quantum, make_run, client
):
    from autopilot.models import Goal

    epic = make_quantum("epic", kind="epic")
    goal = Goal.objects.create(title="Greet", success_criteria="it greets", epic=epic)
    child = make_quantum("one", parent_id=epic.pk)
    calls: list[tuple[Any, str, dict[str, Any]]] = [
        (epic, "planner", dict(tokens_in=100, cache_write_tokens=300, cost_usd=Decimal("0.0020"))),
        (child, "coder", dict(tokens_in=50, cache_read_tokens=550, cost_usd=Decimal("0.0010"))),
        (child, "reviewer", dict(tokens_in=40, priced=False)),
    ]
    for quantum, role, tokens in calls:
        Usage.objects.create(
            agent_run=make_run(role, quantum=quantum), provider="anthropic",
            model="claude-sonnet-4-6", tokens_out=10, **tokens,
        )  # fmt: skip
    # Another quantum's call is not the goal's.
    Usage.objects.create(agent_run=make_run("coder"), provider="x", model="y", tokens_in=999)

    client.force_login(operator_ensure(username="op", password="pw-operator"))
    html = client.get(reverse("goal", args=[goal.pk])).content.decode()

    assert (
        '<p id="goal-agent-spend" class="muted">agents: 3 model calls · 190 tokens in, 550 read '
        "from cache, 300 written to cache (53% from cache) · 30 out · "
        "<b>$0.0030 + 1 calls unpriced</b></p>"
    ) in html
    out = StringIO()
    call_command("goals", "show", str(goal.pk), stdout=out)
    assert (
        "agents:    3 model calls · 1040/30 tokens in/out · cache 53% · $0.0030" in out.getvalue()
    )
    out = StringIO()
    call_command("goals", "show", str(goal.pk), "--json", stdout=out)
    agents = json.loads(out.getvalue())["agents"]
    assert (agents["calls"], agents["cache_write"], agents["unpriced"]) == (3, 300, 1)


def test_the_roles_page_and_psychonaut_roles_show_each_roles_spend(make_run, client):
    for role, tokens in (
        ("coder", dict(tokens_in=100, cache_read_tokens=300, cost_usd=Decimal("0.0040"))),
        ("coder", dict(tokens_in=100, cache_write_tokens=500, cost_usd=Decimal("0.0060"))),
        ("planner", dict(tokens_in=70, priced=False)),
        ("retired", dict(tokens_in=5, cost_usd=Decimal("0.0001"))),
    ):
        Usage.objects.create(
            agent_run=make_run(role), provider="anthropic", model="claude-sonnet-4-6",
            tokens_out=20, **tokens,
        )  # fmt: skip

    client.force_login(operator_ensure(username="op", password="pw-operator"))
    html = client.get(reverse("roles")).content.decode()

    row = html[html.index('<tr id="role-coder">') :]
    row = row[: row.index("</tr>")]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells == ["2", "200", "300", "500", "40", "30%", "$0.0100"]
    assert "price unknown" in html[html.index('<tr id="role-planner">') :]
    assert '<tr id="role-retired">' in html and "not defined" in html  # calls outlive the role
    reviewer = html[html.index('<tr id="role-reviewer">') :]
    assert re.findall(r'<td class="num">([^<]*)</td>', reviewer)[:1] == ["0"]

    out = StringIO()
    call_command("psychonaut", "roles", stdout=out)
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()[2:]}
    cells = rows["coder"].split()
    assert cells[cells.index("1000/40") :][:3] == ["1000/40", "30%", "$0.0100"]
    assert "70/20" in rows["planner"] and "price unknown" in rows["planner"]
    assert "retired" not in rows
    out = StringIO()
    call_command("psychonaut", "roles", "--json", stdout=out)
    [coder] = [r for r in json.loads(out.getvalue()) if r["name"] == "coder"]
    assert coder["spend"]["cache_read"] == 300 and coder["spend"]["cost"] == "$0.0100"
