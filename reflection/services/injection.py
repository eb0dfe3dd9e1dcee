"""The only writer of RuleUse: the playbook section of an agent's prompt, which records the
rules it injects (once per agent run), and the attribution of a drained run's outcome to the
rules and skills its agents were given."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from django.conf import settings
from django.db import connection

from bursts.models import AgentRun, AgentStatus, QuantumRun
from psychonauts.errors import INFRASTRUCTURE
from reflection.injection import ScoredRule, agents_md, rules_for
from reflection.models import PlaybookRule, RuleKind, RuleMaturity, RuleUse, SkillOutcome, SkillUse
from reflection.selection import Policy
from reflection.services.playbook import rule_feedback
from reflection.services.skills import skill_choose, skill_outcome

logger = logging.getLogger(__name__)


def _injected_rules(run: AgentRun) -> list[ScoredRule]:
    """The rules of this run's prompt: chosen and recorded the first time it is built; a
    resumed run rebuilds its prompt from the recorded ones (the same rules, counted once)."""
    recorded = list(
        RuleUse.objects.filter(agent_run_id=run.pk).select_related("rule").order_by("rank")
    )
    if recorded:
        return [
            ScoredRule(
                rule_id=u.rule_id,
                text=u.rule.text,
                kind=u.rule.kind,
                maturity=u.rule.maturity,
                confidence=u.rule.confidence,
                relevance=0.0,
                score=0.0,
            )
            for u in recorded
        ]
    chosen = rules_for(run)
    if chosen:
        RuleUse.objects.bulk_create(
            [
                RuleUse(rule_id=r.rule_id, agent_run_id=run.pk, rank=rank)
                for rank, r in enumerate(chosen, start=1)
            ],
            ignore_conflicts=True,  # ON CONFLICT DO NOTHING: two builds at once count once
        )
    return chosen


def _rule_line(rule: ScoredRule) -> str:
    text = " ".join(rule.text.split())
    if rule.kind == RuleKind.ANTI_PATTERN and not text.lower().startswith("avoid"):
        text = f"Avoid: {text}"
    mark = " (candidate: unconfirmed)" if rule.maturity == RuleMaturity.CANDIDATE else ""
    return f"- {text}{mark} [rule {rule.rule_id}]"


def _skill_use(run: AgentRun) -> SkillUse | None:
    existing = SkillUse.objects.filter(agent_run_id=run.pk).select_related("skill").first()
    if existing is not None:
        return existing
    use = skill_choose(
        agent_run_id=run.pk,
        role=run.role,
        labels=list(run.quantum.labels),
        policy=cast(Policy, settings.REFLECTION_SKILL_POLICY),
    )
    if use is None:
        return None
    return SkillUse.objects.select_related("skill").get(pk=use.pk)


def playbook_section(run: AgentRun) -> str:
    """The prompt section (psychonauts PROMPT_SECTIONS): the playbook's rules for this run,
    the chosen skill's template and the repository's AGENTS.md; "" when there is none."""
    parts: list[str] = []
    rules = _injected_rules(run)
    if rules:
        parts.append(
            "## Playbook\nLessons from earlier runs on this project; a candidate is not yet "
            "confirmed.\n" + "\n".join(_rule_line(r) for r in rules)
        )
    use = _skill_use(run)
    if use is not None:
        parts.append(f"## Skill: {use.skill.name}\n{use.skill.template.strip()}")
    conventions = agents_md()
    if conventions:
        parts.append("## Repository conventions (AGENTS.md)\n" + conventions)
    return "\n\n".join(parts)


_U = RuleUse._meta.db_table
_A = AgentRun._meta.db_table
_S = SkillUse._meta.db_table
# A done agent counts a success, an error a failure; a cancelled agent's uses stay pending (its
# run was stopped from outside, which says nothing about the rules it was given), and so do
# those of an agent that infrastructure ended (a model server down, a context overflow).
SETTLE_RULES_SQL = f"""
UPDATE {_U} u
SET outcome = CASE a.status WHEN %(done)s THEN %(success)s ELSE %(failure)s END
FROM {_A} a
WHERE u.agent_run_id = a.id AND a.quantum_run_id = ANY(%(runs)s) AND u.outcome = %(pending)s
  AND a.status IN (%(done)s, %(error)s) AND NOT starts_with(a.error, %(infrastructure)s)
RETURNING u.rule_id, u.outcome = %(success)s
"""
PENDING_SKILLS_SQL = f"""
SELECT s.id, a.status = %(done)s
FROM {_S} s JOIN {_A} a ON a.id = s.agent_run_id
WHERE a.quantum_run_id = ANY(%(runs)s) AND s.outcome = %(pending)s
  AND a.status IN (%(done)s, %(error)s) AND NOT starts_with(a.error, %(infrastructure)s)
ORDER BY s.id
"""


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """bursts.hooks.ON_RUNS_DRAINED: each finished agent of the drained runs counts its outcome
    once for every rule and skill it was given (inside the manager's transaction: one update
    for the rule uses and one read for the skill uses of all the runs, then the feedback per
    rule and skill)."""
    runs = [run.pk for run, _ in drained]
    if not runs:
        return
    params: dict[str, Any] = {
        "runs": runs,
        "done": AgentStatus.DONE,
        "error": AgentStatus.ERROR,
        "pending": SkillOutcome.PENDING,
        "success": SkillOutcome.SUCCESS,
        "failure": SkillOutcome.FAILURE,
        "infrastructure": INFRASTRUCTURE,
    }
    with connection.cursor() as cursor:
        cursor.execute(SETTLE_RULES_SQL, params)
        settled = cursor.fetchall()
        cursor.execute(PENDING_SKILLS_SQL, params)
        skills = cursor.fetchall()
    for rule_id, success in sorted(settled):
        if PlaybookRule.objects.filter(pk=rule_id).exists():
            rule_feedback(rule_id, bool(success))
    for use_id, success in skills:
        skill_outcome(use_id, bool(success))
    if settled or skills:
        logger.info(
            "runs %s: %d rule and %d skill outcomes",
            runs,
            len(settled),
            len(skills),
            extra={"run_ids": runs, "rules": len(settled), "skills": len(skills)},
        )
