"""Reads of the playbook, the skills and the reflection runs, for the pages and the CLI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.db.models import Case, F, IntegerField, Q, Value, When, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from reflection.errors import NotFound
from reflection.models import (
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleConfidencePoint,
    RuleMaturity,
    RuleScope,
    RuleUse,
    Skill,
    SkillUse,
)
from reflection.selection import Arm, Policy, posterior_mean, ucb1_score
from reflection.services.playbook import confidence_decayed

MATURITY_ORDER: tuple[str, ...] = (
    RuleMaturity.PROVEN,
    RuleMaturity.ESTABLISHED,
    RuleMaturity.CANDIDATE,
    RuleMaturity.DEPRECATED,
)


def rules_list(*, maturity: str | None = None, limit: int = 500) -> list[PlaybookRule]:
    """Rules by maturity (proven first), most confident first within one."""
    qs = PlaybookRule.objects.all()
    if maturity is not None:
        qs = qs.filter(maturity=maturity)
    rank = Case(
        *(When(maturity=m, then=Value(i)) for i, m in enumerate(MATURITY_ORDER)),
        default=Value(len(MATURITY_ORDER)),
        output_field=IntegerField(),
    )
    return list(qs.order_by(rank, "-confidence", "pk")[:limit])


def rules_by_maturity(*, limit: int = 500) -> list[tuple[str, list[PlaybookRule]]]:
    """(maturity, its rules) for every maturity, proven first; empty groups kept."""
    rules = rules_list(limit=limit)
    return [(m, [r for r in rules if r.maturity == m]) for m in MATURITY_ORDER]


def rule_get(*, rule_id: int) -> PlaybookRule:
    rule = PlaybookRule.objects.filter(pk=rule_id).first()
    if rule is None:
        raise NotFound(f"no rule #{rule_id}")
    return rule


def rule_deltas(*, rule_id: int) -> list[PlaybookDelta]:
    """The deltas that changed or propose to change the rule, newest first."""
    return list(PlaybookDelta.objects.filter(rule_id=rule_id).order_by("-created_at", "-pk"))


def deltas_waiting(*, limit: int = 200) -> list[PlaybookDelta]:
    """The deltas waiting for a decision, oldest first: every proposed one (global-scope ones
    can only be grounded by the operator)."""
    return list(
        PlaybookDelta.objects.filter(status=DeltaStatus.PROPOSED)
        .select_related("rule")
        .order_by("created_at", "pk")[:limit]
    )


def deltas_awaiting_grounding(*, limit: int = 200) -> list[PlaybookDelta]:
    """The proposed deltas of global scope: only the operator's grounding applies them."""
    return [d for d in deltas_waiting(limit=limit) if d.scope == RuleScope.GLOBAL]


def deltas_recent(*, limit: int = 50) -> list[PlaybookDelta]:
    """Deltas decided lately, newest first."""
    return list(
        PlaybookDelta.objects.exclude(status=DeltaStatus.PROPOSED)
        .select_related("rule")
        .order_by("-decided_at", "-pk")[:limit]
    )


def reflection_runs_recent(*, limit: int = 20) -> list[ReflectionRun]:
    return list(ReflectionRun.objects.order_by("-created_at", "-pk")[:limit])


@dataclass(frozen=True)
class SkillRow:
    skill: Skill
    posterior_mean: float
    score: float


def _arm(skill: Skill) -> Arm:
    return Arm(skill.pk, skill.alpha, skill.beta, skill.uses)


def skills_list(*, limit: int = 500) -> list[SkillRow]:
    """Every skill with its posterior mean, by name."""
    return [
        SkillRow(s, posterior_mean(_arm(s)), posterior_mean(_arm(s)))
        for s in Skill.objects.order_by("name")[:limit]
    ]


def skills_ranked(
    *, policy: Policy, role: str | None = None, labels: Sequence[str] = ()
) -> list[SkillRow]:
    """The skills matching the role and labels (a skill's empty roles or labels match any;
    no role or labels: no filter), best first by the policy's score: UCB1 its upper bound,
    Thompson and mean the posterior mean (Thompson's expected draw). Ties: lowest id first."""
    qs = Skill.objects.all()
    if role:
        qs = qs.filter(Q(roles=[]) | Q(roles__contains=[role]))
    if labels:
        qs = qs.filter(Q(labels=[]) | Q(labels__overlap=list(labels)))
    skills = list(qs.order_by("pk"))
    total = sum(s.uses for s in skills)
    rows = [
        SkillRow(
            s,
            posterior_mean(_arm(s)),
            ucb1_score(_arm(s), total) if policy == "ucb1" else posterior_mean(_arm(s)),
        )
        for s in skills
    ]
    return sorted(rows, key=lambda r: (-r.score, r.skill.pk))


# --- the wave page's reflection runs ----------------------------------------------------------

# Counts shown in columns of their own; the others are listed after them, zeros left out.
RUN_COUNT_COLUMNS: tuple[str, ...] = ("findings", "proposed", "unsupported", "accepted", "waiting")


@dataclass(frozen=True)
class WaveReflectionRow:
    run: ReflectionRun
    burst_number: int | None
    columns: list[int | None]  # RUN_COUNT_COLUMNS, None where the run has not counted it yet
    other_counts: list[tuple[str, Any]]  # the other non-zero counts, by name
    stages: list[tuple[str, float]]  # (stage, seconds) in the order the run went through them
    seconds: float


def wave_reflection_runs(*, wave_id: int) -> list[WaveReflectionRow]:
    """The wave's reflection runs, one per burst, by burst number (runs whose burst is gone
    last), with their counts and stage timings."""
    runs = (
        ReflectionRun.objects.filter(wave_id=wave_id)
        .select_related("burst")
        .order_by(F("burst__number").asc(nulls_last=True), "pk")
    )
    rows = []
    for run in runs:
        counts: dict[str, Any] = run.counts if isinstance(run.counts, dict) else {}
        timings: dict[str, Any] = run.timings if isinstance(run.timings, dict) else {}
        stages = [(k, float(v)) for k, v in timings.items() if isinstance(v, (int, float))]
        rows.append(
            WaveReflectionRow(
                run=run,
                burst_number=run.burst.number if run.burst is not None else None,
                columns=[counts.get(c) for c in RUN_COUNT_COLUMNS],
                other_counts=sorted(
                    (k, v) for k, v in counts.items() if k not in RUN_COUNT_COLUMNS and v
                ),
                stages=stages,
                seconds=sum(v for _, v in stages),
            )
        )
    return rows


def reflection_event_wave(payload: Mapping[str, Any]) -> int | None:
    """The wave a `reflection:<status>` event concerns: its `wave`, or its run's wave for an
    event that names only the run (an error)."""
    wave = payload.get("wave")
    if isinstance(wave, int) and not isinstance(wave, bool):
        return wave
    run_id = payload.get("reflection_run")
    if not isinstance(run_id, int) or isinstance(run_id, bool):
        return None
    return ReflectionRun.objects.filter(pk=run_id).values_list("wave_id", flat=True).first()


# --- the Focus page: what an agent run was given -------------------------------------------


def agent_run_rule_uses(*, agent_run_id: int) -> list[RuleUse]:
    """The rules injected into the agent run's prompt, in prompt order (index ruleuse_run_rank)."""
    return list(
        RuleUse.objects.filter(agent_run_id=agent_run_id).select_related("rule").order_by("rank")
    )


def agent_run_skill_use(*, agent_run_id: int) -> SkillUse | None:
    """The skill chosen for the agent run, if one was."""
    return SkillUse.objects.filter(agent_run_id=agent_run_id).select_related("skill").first()


# --- confidence over time ---------------------------------------------------------------------

# Points per rule a sparkline draws: the latest ones.
CONFIDENCE_POINTS_MAX = 60

ConfidenceSeries = list[tuple[datetime, float]]


def rules_confidence_series(
    rules: Sequence[PlaybookRule], *, now: datetime | None = None
) -> dict[int, ConfidenceSeries]:
    """Each rule's confidence over time, by rule id, oldest first: its recorded points (the
    latest CONFIDENCE_POINTS_MAX), the value each decayed to just before the next point, and
    its value now (a live rule decayed to now; a deprecated one, which the sweep leaves alone,
    as stored). A rule without points starts where its confidence was last brought up to date.
    One query for all the rules."""
    now = now or timezone.now()
    half_life = settings.REFLECTION_HALF_LIFE_DAYS
    ids = [r.pk for r in rules]
    latest = (
        RuleConfidencePoint.objects.filter(rule_id__in=ids)
        .annotate(
            newest=Window(RowNumber(), partition_by=[F("rule_id")], order_by=[F("at").desc()])
        )
        .filter(newest__lte=CONFIDENCE_POINTS_MAX)
        .order_by("rule_id", "at", "pk")
        .values_list("rule_id", "at", "confidence")
    )
    points: dict[int, ConfidenceSeries] = {rule_id: [] for rule_id in ids}
    for rule_id, at, confidence in latest:
        points[rule_id].append((at, confidence))
    series: dict[int, ConfidenceSeries] = {}
    for rule in rules:
        recorded = points[rule.pk] or [(rule.confidence_at, rule.confidence)]
        line: ConfidenceSeries = [recorded[0]]
        for (at, confidence), (next_at, next_confidence) in pairwise(recorded):
            line.append((next_at, confidence_decayed(confidence, at, next_at, half_life)))
            line.append((next_at, next_confidence))
        if rule.maturity == RuleMaturity.DEPRECATED:
            current = rule.confidence
        else:
            current = confidence_decayed(rule.confidence, rule.confidence_at, now, half_life)
        line.append((max(now, line[-1][0]), current))
        series[rule.pk] = line
    return series
