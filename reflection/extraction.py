"""Extraction: what a burst taught, as findings for the proposing stage (the agents' diary
entries, learnings and challenges, and their failures), with the evidence of each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reflection.models import PlaybookRule, RuleKind
from reflection.services import playbook

TEXT_MAX = 500  # characters: a diary entry longer than this is malformed and skipped
EVIDENCE_EVENTS = 5  # event ids kept per agent run as a proposal's evidence


@dataclass
class Finding:
    """One thing learned from the burst: a diary learning or challenge, or a failure."""

    kind: str  # learning | challenge | failure
    text: str
    role: str
    agent_run_ids: list[int] = field(default_factory=list)


def agent_runs(burst_id: int) -> list[Any]:
    from bursts.models import AgentRun

    return list(AgentRun.objects.filter(quantum_run__burst_id=burst_id).order_by("pk"))


def findings(burst_id: int) -> tuple[list[Finding], int]:
    """The burst's findings and how many diary entries were malformed (skipped)."""
    from bursts.models import AgentStatus
    from psychonauts.models import DiaryEntry

    runs = agent_runs(burst_id)
    by_id = {r.pk: r for r in runs}
    found: list[Finding] = []
    skipped = 0
    entries = DiaryEntry.objects.filter(
        agent_run_id__in=by_id, kind__in=("learning", "challenge")
    ).order_by("pk")
    for entry in entries:
        text = entry.text.strip()
        if not text or len(text) > TEXT_MAX:
            skipped += 1
            continue
        found.append(
            Finding(entry.kind, text, by_id[entry.agent_run_id].role, [entry.agent_run_id])
        )
    failures: dict[tuple[str, str], Finding] = {}
    for r in runs:
        if r.status != AgentStatus.ERROR:
            continue
        error = (r.error.strip().splitlines() or ["an unexplained error"])[0][:200]
        item = failures.setdefault((r.role, error), Finding("failure", error, r.role, []))
        item.agent_run_ids.append(r.pk)
    found.extend(failures.values())
    return found, skipped


def evidence_events(agent_run_ids: list[int]) -> list[int]:
    from bursts.models import AgentRun
    from core.models import Event

    ids: list[int] = []
    for agent_id in AgentRun.objects.filter(pk__in=agent_run_ids).values_list(
        "agent_id", flat=True
    ):
        ids.extend(
            Event.objects.filter(topic=f"agent:{agent_id}")
            .order_by("-pk")
            .values_list("pk", flat=True)[:EVIDENCE_EVENTS]
        )
    return sorted(set(ids))


def proposal_text(item: Finding) -> tuple[str, str]:
    """(text, kind) of the rule a finding proposes."""
    if item.kind == "learning":
        return item.text, RuleKind.RULE
    if item.kind == "challenge":
        return playbook.anti_pattern_of(PlaybookRule(text=item.text)), RuleKind.ANTI_PATTERN
    retries = len(item.agent_run_ids)
    return (
        f"Avoid: {item.text} ({item.role}, failed {retries} time{'s' * (retries != 1)})",
        RuleKind.ANTI_PATTERN,
    )
