"""The only writer of Skill and SkillUse: choosing a skill for an agent run and recording
the outcome of its use, once."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import cast

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from reflection.errors import IllegalTransition, NotFound
from reflection.models import Skill, SkillOutcome, SkillUse
from reflection.selection import Arm, Policy, choose

logger = logging.getLogger(__name__)


def skill_create(*, name: str, template: str, roles: Sequence[str] = (),
                 labels: Sequence[str] = ()) -> Skill:  # fmt: skip
    return Skill.objects.create(
        name=name, template=template, roles=list(roles), labels=list(labels)
    )


def skills_matching(*, role: str, labels: Sequence[str]) -> list[Skill]:
    """The skills for an agent of this role on a quantum with these labels: a skill's empty
    roles or labels match any."""
    return list(
        Skill.objects.filter(Q(roles=[]) | Q(roles__contains=[role]))
        .filter(Q(labels=[]) | Q(labels__overlap=list(labels)))
        .order_by("pk")
    )


@transaction.atomic
def skill_choose(
    *,
    agent_run_id: int,
    role: str,
    labels: Sequence[str] = (),
    policy: Policy | None = None,
    rng: random.Random | None = None,
) -> SkillUse | None:
    """Choose a matching skill by the policy (REFLECTION_SKILL_POLICY by default) and record
    its pending use by the agent run (None when no skill matches). Choosing again for the
    same run and skill returns the existing use."""
    candidates = skills_matching(role=role, labels=labels)
    arms = [Arm(s.pk, s.alpha, s.beta, s.uses) for s in candidates]
    chosen = choose(
        arms,
        policy=policy or cast(Policy, settings.REFLECTION_SKILL_POLICY),
        rng=rng or random.Random(),
    )
    if chosen is None:
        return None
    use, created = SkillUse.objects.get_or_create(skill_id=chosen, agent_run_id=agent_run_id)
    if created:
        Skill.objects.filter(pk=chosen).update(uses=F("uses") + 1, last_used_at=timezone.now())
    return use


@transaction.atomic
def skill_outcome(skill_use_id: int, success: bool) -> SkillUse:
    """Record a use's outcome and update its skill's alpha (success) or beta (failure) —
    once: the use moves pending -> success | failure by compare-and-set, and a second call
    raises IllegalTransition without touching the skill."""
    outcome = SkillOutcome.SUCCESS if success else SkillOutcome.FAILURE
    updated = SkillUse.objects.filter(pk=skill_use_id, outcome=SkillOutcome.PENDING).update(
        outcome=outcome
    )
    if updated != 1:
        current = SkillUse.objects.filter(pk=skill_use_id).values_list("outcome", flat=True).first()
        if current is None:
            raise NotFound(f"no skill use #{skill_use_id}")
        raise IllegalTransition(f"skill use #{skill_use_id} already has its outcome: {current}")
    use = SkillUse.objects.get(pk=skill_use_id)
    counter = "alpha" if success else "beta"
    Skill.objects.filter(pk=use.skill_id).update(**{counter: F(counter) + 1.0})
    logger.info(
        "skill use %s: %s",
        skill_use_id,
        outcome,
        extra={"skill_use_id": skill_use_id, "skill_id": use.skill_id, "outcome": str(outcome)},
    )
    return use
