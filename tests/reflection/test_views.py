"""The Playbook and Skills pages, grounding / rejecting deltas and deprecating rules (who may,
CSRF), and the playbook deltas on the Grounding page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from bursts.models import AgentRun
from core.access import operator_ensure, viewer_ensure
from reflection.models import (
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleMaturity,
    Skill,
)
from reflection.services.playbook import delta_propose, rule_create
from reflection.services.skills import skill_create


@pytest.fixture
def op_client(client: Client, db: Any) -> Client:
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    return client


@pytest.fixture
def viewer_client(db: Any) -> Client:
    c = Client()
    c.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    return c


def test_it_requires_login(client: Client, db: Any) -> None:
    for name in ("playbook", "skills"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_it_shows_rules_by_maturity_with_their_record_and_evidence(
    viewer_client: Client, agent_run: AgentRun
) -> None:
    rule = rule_create(
        text="Run the tests before finishing",
        evidence_agent_run_ids=[agent_run.pk],
        evidence_event_ids=[77],
    )
    PlaybookRule.objects.filter(pk=rule.pk).update(
        maturity=RuleMaturity.ESTABLISHED, confidence=0.8, helpful=4, harmful=1
    )
    rule_create(text="Avoid giant diffs", kind="anti_pattern")
    ReflectionRun.objects.create(status="completed", counts={"proposed": 2})
    html = viewer_client.get(reverse("playbook")).content.decode()
    assert html.index('id="maturity-established"') < html.index(f'id="rule-{rule.pk}"')
    assert html.index(f'id="rule-{rule.pk}"') < html.index('id="maturity-candidate"')
    assert "Run the tests before finishing" in html and "0.80" in html
    assert "<td>4</td>" in html and "<td>1</td>" in html
    assert f'href="{reverse("focus", args=[agent_run.pk])}"' in html and "event #77" in html
    assert "<b>Avoid:</b> Avoid giant diffs" in html
    assert "proposed 2" in html
    assert 'id="nav-playbook"' in html and 'id="nav-skills"' in html
    assert "rule-deprecate-" not in html  # viewers see no actions
    assert "<script" not in html.split("</nav>")[-1] and "style=" not in html


def test_it_shows_skills_with_their_record(viewer_client: Client) -> None:
    skill = skill_create(name="tdd", template="Write the test first.", roles=["coder"])
    Skill.objects.filter(pk=skill.pk).update(alpha=4.0, beta=2.0, uses=5)
    html = viewer_client.get(reverse("skills")).content.decode()
    assert f'id="skill-{skill.pk}"' in html
    for cell in ("<td>tdd</td>", "<td>4.0</td>", "<td>2.0</td>", "<td>0.667</td>", "<td>5</td>"):
        assert cell in html
    assert "never" in html


def test_it_grounds_a_global_delta_into_a_rule(op_client: Client) -> None:
    delta = delta_propose(op="add", text="Pin the versions", scope="global")
    html = op_client.get(reverse("playbook")).content.decode()
    assert f'id="delta-ground-{delta.pk}"' in html and "needs grounding" in html
    response = op_client.post(reverse("delta_ground", args=[delta.pk]))
    assert response.status_code == 302 and response["Location"].endswith(f"#delta-{delta.pk}")
    delta.refresh_from_db()
    assert delta.status == DeltaStatus.GROUNDED and delta.decided_by == "op"
    rule = PlaybookRule.objects.get(text="Pin the versions")
    assert rule.maturity == RuleMaturity.CANDIDATE and rule.scope == "global"
    again = op_client.post(reverse("delta_ground", args=[delta.pk]), follow=True)
    assert "cannot move delta" in again.content.decode()
    assert PlaybookRule.objects.count() == 1


def test_it_rejects_a_delta_with_its_reason_back_to_grounding(op_client: Client) -> None:
    delta = delta_propose(op="add", text="Never test", scope="global")
    response = op_client.post(
        reverse("delta_reject", args=[delta.pk]), {"reason": "wrong", "next": "grounding"}
    )
    assert response["Location"] == reverse("grounding") + f"#delta-{delta.pk}"
    delta.refresh_from_db()
    assert delta.status == DeltaStatus.REJECTED and delta.reason == "wrong"
    assert not PlaybookRule.objects.exists()


def test_it_deprecates_a_rule(op_client: Client) -> None:
    rule = rule_create(text="old")
    response = op_client.post(reverse("rule_deprecate", args=[rule.pk]))
    assert response.status_code == 302
    rule.refresh_from_db()
    assert rule.maturity == RuleMaturity.DEPRECATED
    assert PlaybookDelta.objects.get(rule=rule).status == DeltaStatus.GROUNDED


def test_it_refuses_viewers_get_and_unknown_ids(op_client: Client, viewer_client: Client) -> None:
    delta = delta_propose(op="add", text="x")
    rule = rule_create(text="y")
    for url in (
        reverse("delta_ground", args=[delta.pk]),
        reverse("delta_reject", args=[delta.pk]),
        reverse("rule_deprecate", args=[rule.pk]),
    ):
        assert viewer_client.post(url).status_code == 403
        assert op_client.get(url).status_code == 405
    assert op_client.post(reverse("delta_ground", args=[999999])).status_code == 404
    assert op_client.post(reverse("rule_deprecate", args=[999999])).status_code == 404
    delta.refresh_from_db()
    rule.refresh_from_db()
    assert delta.status == DeltaStatus.PROPOSED and rule.maturity == RuleMaturity.CANDIDATE


def test_it_requires_the_csrf_token(db: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    delta = delta_propose(op="add", text="x")
    assert client.post(reverse("delta_ground", args=[delta.pk])).status_code == 403
    delta.refresh_from_db()
    assert delta.status == DeltaStatus.PROPOSED
    html = client.get(reverse("playbook")).content.decode()
    assert 'name="csrfmiddlewaretoken"' in html


def test_it_lists_playbook_deltas_on_the_grounding_page(
    op_client: Client, viewer_client: Client
) -> None:
    waiting = delta_propose(op="add", text="Check the migrations", scope="global")
    decided = delta_propose(op="add", text="Decided already")
    PlaybookDelta.objects.filter(pk=decided.pk).update(status=DeltaStatus.REJECTED)
    html = op_client.get(reverse("grounding")).content.decode()
    assert html.index("Pipeline mutations") < html.index("Playbook deltas")
    assert f'id="delta-{waiting.pk}"' in html and "Check the migrations" in html
    assert "Decided already" not in html
    assert f'id="delta-ground-{waiting.pk}"' in html and 'value="grounding"' in html
    viewer_html = viewer_client.get(reverse("grounding")).content.decode()
    assert "Check the migrations" in viewer_html
    assert f'id="delta-ground-{waiting.pk}"' not in viewer_html


def test_it_says_so_when_no_delta_waits(viewer_client: Client) -> None:
    assert "No playbook change waiting." in viewer_client.get(reverse("grounding")).content.decode()
