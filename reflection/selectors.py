"""Reads of the playbook, the skills and the reflection runs, for the pages and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Case, IntegerField, Q, Value, When

from reflection.errors import NotFound
from reflection.models import (
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleMaturity,
    RuleScope,
    Skill,
)
from reflection.selection import Arm, Policy, posterior_mean, ucb1_score

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
