"""Skills chosen for an agent run and their outcome recorded once."""

from __future__ import annotations

import random

import pytest

from bursts.models import AgentRun
from reflection.errors import IllegalTransition
from reflection.models import Skill, SkillOutcome
from reflection.services.skills import skill_choose, skill_create, skill_outcome

pytestmark = pytest.mark.django_db


def test_it_chooses_a_matching_skill_and_records_a_pending_use(agent_run: AgentRun) -> None:
    skill_create(name="reviewer-only", template="t", roles=["reviewer"])
    coder = skill_create(name="coder", template="t", roles=["coder"])
    use = skill_choose(agent_run_id=agent_run.pk, role="coder", rng=random.Random(0))
    assert use is not None
    assert use.skill_id == coder.pk
    assert use.outcome == SkillOutcome.PENDING
    coder.refresh_from_db()
    assert coder.uses == 1
    assert coder.last_used_at is not None


def test_it_chooses_nothing_when_no_skill_matches(agent_run: AgentRun) -> None:
    skill_create(name="ui", template="t", labels=["ui"])
    assert skill_choose(agent_run_id=agent_run.pk, role="coder", labels=["db"]) is None


def test_it_records_a_success_once(agent_run: AgentRun) -> None:
    skill = skill_create(name="s", template="t")
    use = skill_choose(agent_run_id=agent_run.pk, role="coder", policy="mean")
    assert use is not None
    skill_outcome(use.pk, True)
    with pytest.raises(IllegalTransition):
        skill_outcome(use.pk, True)
    with pytest.raises(IllegalTransition):
        skill_outcome(use.pk, False)
    skill.refresh_from_db()
    assert (skill.alpha, skill.beta) == (2.0, 1.0)
    use.refresh_from_db()
    assert use.outcome == SkillOutcome.SUCCESS


def test_a_failure_raises_beta(agent_run: AgentRun) -> None:
    skill = skill_create(name="s", template="t")
    use = skill_choose(agent_run_id=agent_run.pk, role="coder", policy="thompson")
    assert use is not None
    skill_outcome(use.pk, False)
    skill.refresh_from_db()
    assert (skill.alpha, skill.beta) == (1.0, 2.0)


def test_choosing_again_for_the_same_run_keeps_one_use(agent_run: AgentRun) -> None:
    skill_create(name="s", template="t")
    first = skill_choose(agent_run_id=agent_run.pk, role="coder", policy="mean")
    again = skill_choose(agent_run_id=agent_run.pk, role="coder", policy="mean")
    assert first is not None and again is not None
    assert first.pk == again.pk
    assert Skill.objects.get().uses == 1
