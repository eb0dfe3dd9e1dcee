"""What reflection shows on other pages: a wave's reflection runs on the wave page, the rules
and skill injected into an agent run on its Focus page, and each rule's confidence over time
on the Playbook page."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bursts.models import AgentRun, Burst, Wave
from core.access import viewer_ensure
from psychonauts.runtime.runs import agent_run_create
from quanta.services import quantum_create
from reflection import pipeline
from reflection.models import (
    PlaybookRule,
    ReflectionRun,
    RuleConfidencePoint,
    RuleUse,
    SkillUse,
)
from reflection.selectors import rules_confidence_series
from reflection.services.injection import playbook_section
from reflection.services.playbook import (
    confidence_after,
    confidence_decayed,
    rule_create,
    rule_feedback,
    rules_decay,
)
from reflection.services.skills import skill_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_client(db: Any) -> Client:
    c = Client()
    c.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    return c


def _row(html: str, element_id: str) -> str:
    match = re.search(rf'<tr id="{element_id}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"no row {element_id}"
    return match.group(0)


# --- the wave page ----------------------------------------------------------------------------


def test_the_wave_page_lists_its_reflection_runs_by_burst(viewer_client: Client) -> None:
    wave = Wave.objects.create()
    first = Burst.objects.create(wave=wave, number=1)
    second = Burst.objects.create(wave=wave, number=2)
    failed = ReflectionRun.objects.create(
        wave=wave,
        burst=second,
        status="error",
        error="evaluating: RuntimeError: search index unavailable",
        counts={"agent_runs": 3, "findings": 2, "proposed": 2},
    )
    done = ReflectionRun.objects.create(
        wave=wave,
        burst=first,
        status="completed",
        counts={"proposed": 4, "unsupported": 1, "accepted": 2, "duplicates": 1},
        timings={"extracting": 0.25, "proposing": 0.5, "evaluating": 1.0, "curating": 0.25},
        finished_at=timezone.now(),
    )
    elsewhere = ReflectionRun.objects.create(
        wave=Wave.objects.create(), burst=None, status="completed"
    )

    html = viewer_client.get(reverse("wave", args=[wave.pk])).content.decode()

    assert 'id="wave-reflection" data-swap="replace"' in html
    assert html.index(f'id="wave-reflection-{done.pk}"') < html.index(
        f'id="wave-reflection-{failed.pk}"'
    )
    assert f'id="wave-reflection-{elsewhere.pk}"' not in html
    row = _row(html, f"wave-reflection-{done.pk}")
    assert "burst&nbsp;1" in row and 'data-status="completed"' in row and ">completed</span>" in row
    cells = re.findall(r'<td class="num">(.*?)</td>', row)
    muted = '<span class="muted">-</span>'
    assert cells[:5] == [muted, "4", "1", "2", muted]  # findings .. waiting
    assert "duplicates 1" in row and "2.00" in row  # seconds across the stages
    assert "evaluating 1.000 s" in row
    row = _row(html, f"wave-reflection-{failed.pk}")
    assert "burst&nbsp;2" in row and ">error</span>" in row
    assert "evaluating: RuntimeError: search index unavailable" in row
    assert re.findall(r'<td class="num">(.*?)</td>', row)[:5] == [
        "2",
        "2",
        '<span class="muted">-</span>',
        '<span class="muted">-</span>',
        '<span class="muted">-</span>',
    ]  # not counted yet
    assert "agent_runs 3" in row
    # The page follows every reflection stage's topic besides the bursts'.
    topics = re.search(r'data-topics="([^"]*)"', html)
    assert topics is not None
    for status in ("started", "extracting", "curating", "completed", "error"):
        assert f"reflection:{status}" in topics.group(1)


def test_a_wave_without_reflection_says_so(viewer_client: Client) -> None:
    wave = Wave.objects.create()
    html = viewer_client.get(reverse("wave", args=[wave.pk])).content.decode()
    assert "No reflection yet" in html


def test_a_burst_reflected_on_shows_its_completed_run(viewer_client: Client, burst: Burst) -> None:
    run, cached = pipeline.reflect_burst(burst.pk)
    assert run is not None and not cached and run.status == "completed"
    html = viewer_client.get(reverse("wave", args=[burst.wave_id])).content.decode()
    row = _row(html, f"wave-reflection-{run.pk}")
    assert 'data-status="completed"' in row and '<td class="num">0</td>' in row


# --- the Focus page ---------------------------------------------------------------------------


def test_the_focus_page_shows_the_injected_rules_and_the_chosen_skill(
    viewer_client: Client, settings: Any, tmp_path: Any
) -> None:
    settings.ANNIHILATION_REPO = tmp_path / "norepo"  # no AGENTS.md
    quantum = quantum_create(title="Finish the tests", body="without giant diffs or migrations")
    agent_run = agent_run_create(quantum_id=quantum.pk, role="coder")
    strong = rule_create(text="Run the tests before finishing", roles=["coder"])
    weak = rule_create(text="Avoid: giant diffs", kind="anti_pattern", roles=["coder"])
    PlaybookRule.objects.filter(pk=strong.pk).update(confidence=0.9, maturity="proven")
    PlaybookRule.objects.filter(pk=weak.pk).update(confidence=0.4)
    skill_create(name="tdd", template="Write the test first.", roles=["coder"])
    rule_create(text="Review the migration plan", roles=["reviewer"])  # not this role's

    prompt = playbook_section(agent_run)  # what the agent was given, recorded once
    assert "Run the tests before finishing" in prompt
    uses = list(RuleUse.objects.filter(agent_run=agent_run).order_by("rank"))
    assert [u.rule_id for u in uses] == [strong.pk, weak.pk]
    RuleUse.objects.filter(pk=uses[0].pk).update(outcome="success")
    RuleUse.objects.filter(pk=uses[1].pk).update(outcome="failure")

    html = viewer_client.get(reverse("focus", args=[agent_run.pk])).content.decode()

    assert 'id="focus-playbook"' in html
    first, second = _row(html, f"rule-use-{uses[0].pk}"), _row(html, f"rule-use-{uses[1].pk}")
    assert html.index(first) < html.index(second)
    assert '<td class="num">1</td>' in first and '<td class="num">2</td>' in second
    assert f'href="{reverse("playbook")}#rule-{strong.pk}"' in first
    assert "Run the tests before finishing" in first and "proven" in first and "0.90" in first
    assert ">success</span>" in first
    assert "<b>Avoid:</b> Avoid: giant diffs" in second and "candidate" in second
    assert "0.40" in second and ">failure</span>" in second
    assert "Review the migration plan" not in html
    skill = SkillUse.objects.get(agent_run=agent_run)
    assert f'href="{reverse("skills")}#skill-{skill.skill_id}">tdd</a>' in html
    assert ">pending</span>" in html.split('id="focus-skill"')[1]


def test_a_run_given_no_rule_says_so(viewer_client: Client, agent_run: AgentRun) -> None:
    html = viewer_client.get(reverse("focus", args=[agent_run.pk])).content.decode()
    assert "No playbook rule was injected" in html and "No skill was chosen" in html


# --- confidence over time ---------------------------------------------------------------------


def test_a_rule_records_its_confidence_at_creation_and_each_feedback(settings: Any) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 30
    rule = rule_create(text="Keep migrations small")
    start = rule.confidence_at
    rule_feedback(rule.pk, True, now=start + timedelta(days=30))
    rule_feedback(rule.pk, False, now=start + timedelta(days=60))
    points = list(
        RuleConfidencePoint.objects.filter(rule=rule)
        .order_by("at")
        .values_list("cause", "confidence", "at")
    )
    after_first = confidence_after(0.25, success=True)  # 0.5 halved over one half-life
    after_second = confidence_after(after_first / 2, success=False)
    assert [(c, round(v, 6), at) for c, v, at in points] == [
        ("created", 0.5, start),
        ("success", round(after_first, 6), start + timedelta(days=30)),
        ("failure", round(after_second, 6), start + timedelta(days=60)),
    ]
    rules_decay(now=start + timedelta(days=90))  # the sweep records nothing
    assert RuleConfidencePoint.objects.filter(rule=rule).count() == 3


def test_the_series_decays_between_points_and_up_to_now(settings: Any) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 30
    rule = rule_create(text="Prefer small commits")
    start = rule.confidence_at
    rule_feedback(rule.pk, True, now=start + timedelta(days=30))
    rules_decay(now=start + timedelta(days=45))  # the sweep moves confidence_at
    now = start + timedelta(days=90)
    rule.refresh_from_db()

    series = rules_confidence_series([rule], now=now)[rule.pk]

    after_first = confidence_after(0.25, success=True)
    assert [at for at, _ in series] == [
        start,
        start + timedelta(days=30),
        start + timedelta(days=30),
        now,
    ]
    assert [round(v, 6) for _, v in series] == [
        0.5,
        0.25,  # decayed just before the feedback
        round(after_first, 6),
        round(after_first / 4, 6),  # two half-lives to now, across the sweep
    ]
    assert confidence_decayed(rule.confidence, rule.confidence_at, now, 30) == pytest.approx(
        series[-1][1]
    )


def test_a_deprecated_rule_ends_where_it_was_left_and_an_old_rule_starts_from_its_value(
    settings: Any,
) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 30
    deprecated = rule_create(text="Push on Fridays")
    PlaybookRule.objects.filter(pk=deprecated.pk).update(maturity="deprecated", confidence=0.2)
    now = timezone.now() + timedelta(days=30)
    # A rule from before confidence was recorded: no point at all.
    old = PlaybookRule.objects.create(
        text="Read the README", confidence=0.8, confidence_at=now - timedelta(days=30)
    )
    deprecated.refresh_from_db()
    series = rules_confidence_series([deprecated, old], now=now)
    assert series[deprecated.pk][-1] == (now, 0.2)
    assert series[old.pk] == [(now - timedelta(days=30), 0.8), (now, pytest.approx(0.4))]


def test_the_playbook_page_draws_each_rules_confidence_as_a_sparkline(
    viewer_client: Client, settings: Any
) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 30
    rule = rule_create(text="Run the linters")
    start = timezone.now() - timedelta(days=20)
    PlaybookRule.objects.filter(pk=rule.pk).update(confidence_at=start)
    RuleConfidencePoint.objects.filter(rule=rule).update(at=start)
    for days in (5, 10, 15):
        rule_feedback(rule.pk, True, now=start + timedelta(days=days))

    html = viewer_client.get(reverse("playbook")).content.decode()

    row = _row(html, f"rule-{rule.pk}")
    svg = re.search(rf'<svg class="sparkline" id="confidence-{rule.pk}".*?</svg>', row, re.S)
    assert svg is not None
    points = re.search(r'<polyline points="([^"]+)"', svg.group(0))
    assert points is not None
    xy = [tuple(float(n) for n in p.split(",")) for p in points.group(1).split()]
    assert len(xy) == 1 + 2 * 3 + 1  # created, (decayed, fed back) x3, now
    assert xy[0] == (0.0, 12.0)  # 0.5 at the start, mid-height of 24 px
    assert xy[-1][0] == 120.0  # now, at the right edge
    assert [x for x, _ in xy] == sorted(x for x, _ in xy)
    climbs = [xy[i][1] for i in (2, 4, 6)]
    assert climbs == sorted(climbs, reverse=True)  # each success higher (smaller y)
    assert "<title>confidence 0.50 on " in svg.group(0)
    assert "style=" not in svg.group(0) and "<script" not in svg.group(0)
