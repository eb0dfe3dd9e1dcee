"""Reflection's admin pages load, filter and search; deltas, skill uses and runs are
read-only (deltas are decided through the service)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from bursts.models import AgentRun, Burst
from reflection.models import RuleConfidencePoint, RuleUse, SkillUse
from reflection.services.playbook import delta_propose, rule_create
from reflection.services.runs import reflection_run_start
from reflection.services.skills import skill_choose, skill_create

pytestmark = pytest.mark.django_db

MODELS = (
    "playbookrule",
    "playbookdelta",
    "skill",
    "skilluse",
    "reflectionrun",
    "ruleuse",
    "ruleconfidencepoint",
)


@pytest.fixture
def admin_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.fixture
def rows(burst: Burst, agent_run: AgentRun) -> dict[str, Any]:
    rule = rule_create(text="Read the failing test first", roles=["coder"])
    delta = delta_propose(op="update", rule_id=rule.pk, text="Read the test first")
    skill_create(name="bisect", template="git bisect ...")
    skill_choose(agent_run_id=agent_run.pk, role="coder")
    run, _ = reflection_run_start(burst.pk)
    use = RuleUse.objects.create(rule=rule, agent_run=agent_run, rank=1)
    return {
        "ruleuse": use,
        "ruleconfidencepoint": RuleConfidencePoint.objects.filter(rule=rule).first(),
        "playbookrule": rule,
        "playbookdelta": delta,
        "skill": skill_create(name="tdd", template="red green"),
        "skilluse": SkillUse.objects.get(),
        "reflectionrun": run,
    }


def test_every_page_loads(admin_client: Client, rows: dict[str, Any]) -> None:
    for name in MODELS:
        changelist = reverse(f"admin:reflection_{name}_changelist")
        assert admin_client.get(changelist).status_code == 200, changelist
        assert admin_client.get(changelist, {"q": "test"}).status_code == 200, changelist
        change = reverse(f"admin:reflection_{name}_change", args=[rows[name].pk])
        assert admin_client.get(change).status_code == 200, change


def test_deltas_runs_and_uses_cannot_be_added_or_changed(
    admin_client: Client, rows: dict[str, Any]
) -> None:
    for name in (
        "playbookdelta",
        "skilluse",
        "reflectionrun",
        "playbookrule",
        "ruleuse",
        "ruleconfidencepoint",
    ):
        assert admin_client.get(reverse(f"admin:reflection_{name}_add")).status_code == 403
    delta = rows["playbookdelta"]
    change = reverse("admin:reflection_playbookdelta_change", args=[delta.pk])
    assert admin_client.post(change, {"status": "accepted"}).status_code == 403
    delta.refresh_from_db()
    assert delta.status == "proposed"
