"""Injection of the playbook into an agent's prompt, and the attribution of outcomes."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from bursts.hooks import ON_RUNS_DRAINED
from bursts.models import AgentRun, AgentStatus, Burst, QuantumRun, Wave
from psychonauts.providers.base import ProviderRequest
from psychonauts.providers.scripted import ScriptedProvider
from psychonauts.roles import roles_sync_defaults
from psychonauts.services import agent_run_create, agent_run_execute
from psychonauts.services.prompt import PROMPT_SECTIONS, agent_prompt
from quanta.services import quantum_create
from reflection import hooks
from reflection.injection import AGENTS_MD_MAX_BYTES, agents_md, rules_for
from reflection.models import PlaybookRule, RuleMaturity, RuleUse, Skill, SkillUse
from reflection.services.injection import on_runs_drained
from reflection.services.playbook import rule_create
from reflection.services.skills import skill_choose, skill_create

pytestmark = pytest.mark.django_db


def rule(text: str, **fields: Any) -> PlaybookRule:
    created = rule_create(text=text)
    if fields:
        PlaybookRule.objects.filter(pk=created.pk).update(**fields)
        created.refresh_from_db()
    return created


def run_for(title: str, *, body: str = "", labels: list[str] | None = None,
            role: str = "coder") -> AgentRun:  # fmt: skip
    q = quantum_create(title=title, body=body, labels=labels or [])
    return agent_run_create(quantum_id=q.pk, role=role)


@pytest.fixture
def no_agents_md(tmp_path: Path, settings: Any) -> Path:
    settings.ANNIHILATION_REPO = tmp_path / "norepo"
    return tmp_path


def test_the_hooks_are_registered() -> None:
    assert hooks.playbook_section in PROMPT_SECTIONS
    assert hooks.on_runs_drained in ON_RUNS_DRAINED


def test_a_later_agents_provider_request_carries_the_injected_rule(repo: Path, monkeypatch):
    roles_sync_defaults()
    taught = rule("Run the test suite before committing a greeting change", confidence=0.9)
    (repo / "AGENTS.md").write_text("Use four spaces.\n", encoding="utf-8")
    requests: list[ProviderRequest] = []
    complete = ScriptedProvider.complete

    def recording(self: ScriptedProvider, request: ProviderRequest, on_text: Any) -> Any:
        requests.append(request)
        return complete(self, request, on_text)

    monkeypatch.setattr(ScriptedProvider, "complete", recording)
    run = run_for("Add a greeting", body="Say hello to the user")

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    first = requests[0].messages[0]["content"]
    assert isinstance(first, str)
    assert "## Playbook" in first
    line = "Run the test suite before committing a greeting change (candidate: unconfirmed)"
    assert f"- {line} [rule {taught.pk}]" in first
    assert "## Repository conventions (AGENTS.md)\nUse four spaces." in first
    assert list(
        RuleUse.objects.filter(agent_run=run).values_list("rule_id", "rank", "outcome")
    ) == [(taught.pk, 1, "pending")]


def test_ranking_weighs_text_labels_role_confidence_and_maturity(no_agents_md) -> None:
    run = run_for("Fix the login token refresh", labels=["auth"])
    text = rule("Refresh the login token before it expires", confidence=0.5)
    label = rule("Keep secrets out of logs", labels=["auth"], confidence=0.5)
    other_role = rule("Refresh the login token in tests", roles=["tester"], confidence=0.9)
    unrelated = rule("Write docstrings for the billing module", confidence=1.0)
    proven = rule("Refresh the login token before it expires!", confidence=0.5,
                  maturity=RuleMaturity.PROVEN)  # fmt: skip
    mine = rule("Refresh the login token and retry once", roles=["coder"], confidence=0.5)

    confident = rule("Refresh the login token before it expires.", confidence=1.0)

    ranked = rules_for(run, limit=10)
    ids = [r.rule_id for r in ranked]

    assert other_role.pk not in ids, "a rule for another role"
    assert unrelated.pk not in ids, "no word or label in common"
    # proven x1.5 > confident (1.0 vs 0.5) > the role named > a shared label > text alone
    assert ids == [proven.pk, confident.pk, mine.pk, label.pk, text.pk]
    assert [r.rule_id for r in rules_for(run, limit=2)] == ids[:2]
    assert all(a.score >= b.score for a, b in itertools.pairwise(ranked))


def test_the_top_k_setting_limits_the_rules(no_agents_md, settings) -> None:
    for n in range(4):
        rule(f"Cache invalidation rule number {n}")
    run = run_for("Cache invalidation")
    settings.REFLECTION_INJECT_TOP_K = 2
    assert len(rules_for(run)) == 2
    settings.REFLECTION_INJECT_TOP_K = 0
    assert rules_for(run) == []


def test_a_deprecated_rule_is_never_injected(no_agents_md) -> None:
    gone = rule("Deploy the queue worker by hand", maturity=RuleMaturity.DEPRECATED, confidence=1.0)
    run = run_for("Deploy the queue worker")
    assert gone.pk not in [r.rule_id for r in rules_for(run)]
    assert "## Playbook" not in agent_prompt(run)


def test_agents_md_is_included_and_capped(tmp_path: Path, settings) -> None:
    settings.ANNIHILATION_REPO = tmp_path
    (tmp_path / "AGENTS.md").write_text("x" * (AGENTS_MD_MAX_BYTES + 500), encoding="utf-8")
    text = agents_md()
    assert text.startswith("x" * 100)
    assert text.count("x") == AGENTS_MD_MAX_BYTES
    assert "cut at" in text
    run = run_for("Anything at all")
    assert "## Repository conventions (AGENTS.md)" in agent_prompt(run)
    (tmp_path / "AGENTS.md").write_bytes(b"\x00\x01binary")
    assert agents_md() == ""
    (tmp_path / "AGENTS.md").unlink()
    assert agents_md() == ""


def test_a_resumed_run_gets_the_same_rules_counted_once(no_agents_md) -> None:
    first = rule("Retry the flaky search index build", confidence=0.6)
    run = run_for("Search index build is flaky")
    skill = skill_create(name="careful", template="Work carefully.")
    skill_create(name="fast", template="Work fast.")

    prompt = agent_prompt(run)
    later = rule("Retry the flaky search index build twice", confidence=1.0,
                 maturity=RuleMaturity.PROVEN)  # fmt: skip
    again = agent_prompt(run)

    assert f"[rule {first.pk}]" in prompt and f"[rule {first.pk}]" in again
    assert f"[rule {later.pk}]" not in again, "the rebuilt prompt keeps the recorded rules"
    assert RuleUse.objects.filter(agent_run=run).count() == 1
    uses = list(SkillUse.objects.filter(agent_run=run))
    assert len(uses) == 1
    chosen = Skill.objects.get(pk=uses[0].skill_id)
    assert chosen.uses == 1
    assert f"## Skill: {chosen.name}\n{chosen.template}" in again
    assert skill.pk  # both skills matched (empty roles and labels)


def drained_run(*statuses: str) -> tuple[QuantumRun, list[AgentRun]]:
    q = quantum_create(title="Fix the flaky cache")
    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    qrun = QuantumRun.objects.create(wave=wave, burst=burst, quantum=q, pipeline_name="default")
    agents = []
    for n, status in enumerate(statuses):
        agent = agent_run_create(quantum_id=q.pk, role="coder", agent_id=f"{q.pk}_a{n}")
        AgentRun.objects.filter(pk=agent.pk).update(quantum_run=qrun, status=status)
        agents.append(agent)
    return qrun, agents


def test_a_drained_run_attributes_outcomes_to_rules_and_skills_once(no_agents_md) -> None:
    cache = rule("Clear the flaky cache before the test run", confidence=0.5)
    skill = skill_create(name="only", template="Only skill.")
    qrun, (ok, failed, cancelled) = drained_run(
        AgentStatus.DONE, AgentStatus.ERROR, AgentStatus.CANCELLED
    )
    for agent in (ok, failed, cancelled):
        agent.refresh_from_db()
        agent_prompt(agent)
        skill_choose(agent_run_id=agent.pk, role="coder", rng=random.Random(1))

    on_runs_drained([(qrun, "done")])
    on_runs_drained([(qrun, "done")])  # drained twice: counted once

    cache.refresh_from_db()
    assert (cache.helpful, cache.harmful) == (1, 1)
    assert cache.last_feedback_at is not None
    skill.refresh_from_db()
    assert (skill.alpha, skill.beta) == (2.0, 2.0)
    outcomes = dict(RuleUse.objects.filter(rule=cache).values_list("agent_run_id", "outcome"))
    assert outcomes == {ok.pk: "success", failed.pk: "failure", cancelled.pk: "pending"}
    assert SkillUse.objects.get(agent_run=cancelled).outcome == "pending"
