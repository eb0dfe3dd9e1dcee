"""Extraction: what a burst taught, as findings for the proposing stage, with the evidence of
each: the diary entries (learnings and challenges) its agents wrote and the reflector extracted,
its failed agent runs (every failed attempt of a stage), and the changes and drifts the Tether
rejected since the reflection before this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psychonauts.errors import INFRASTRUCTURE
from psychonauts.events import AgentEventType
from reflection.models import PlaybookRule, ReflectionRun, RuleKind
from reflection.services import playbook

TEXT_MAX = 500  # characters: a diary entry longer than this is malformed and skipped
EVIDENCE_EVENTS = 5  # event ids kept per agent run as a proposal's evidence
VERDICT_FAIL = "VERDICT: FAIL"  # how the result of a run that failed its review begins


@dataclass
class Finding:
    """One thing learned from the burst: a diary learning or challenge, or a failure."""

    kind: str  # learning | challenge | failure | failed_review | rejected_change | rejected_drift
    text: str
    role: str
    agent_run_ids: list[int] = field(default_factory=list)
    by: str = ""  # failed_review: the reviewing role that failed the work


_COMMITTED: AgentEventType = "committed"


def _committed(agent_run_ids: list[int]) -> set[int]:
    """The agent runs among these whose sessions committed work."""
    from core.models import Event, Session

    if not agent_run_ids:
        return set()
    return {
        int(ref)
        for ref in Event.objects.filter(
            type__in=[_COMMITTED, "commit"],  # "commit": rows of an earlier release
            session__kind=Session.Kind.AGENT_RUN,
            session__ref__in=[str(pk) for pk in agent_run_ids],
        ).values_list("session__ref", flat=True)
    }


def agent_runs_count(burst_id: int) -> int:
    from bursts.models import AgentRun

    return AgentRun.objects.filter(quantum_run__burst_id=burst_id).count()


def agent_runs(burst_id: int) -> list[Any]:
    """The burst's agent runs as findings read them: who did what and how it ended, without
    their context and result (the largest columns, a burst may have 60,000 rows); the result of
    a failed run is read by `failed_results`."""
    from bursts.models import AgentRun

    return list(
        AgentRun.objects.filter(quantum_run__burst_id=burst_id)
        .only("id", "quantum_run_id", "stage_index", "role", "status", "error")
        .order_by("pk")
    )


def failed_results(runs: list[Any]) -> dict[int, str]:
    """The results of the failed runs among `runs` (a review that failed a change says so in
    its result), in one query."""
    from bursts.models import AgentRun, AgentStatus

    failed = [r.pk for r in runs if r.status == AgentStatus.ERROR]
    if not failed:
        return {}
    return dict(AgentRun.objects.filter(pk__in=failed).values_list("pk", "result"))


def findings(burst_id: int) -> tuple[list[Finding], int]:
    """The burst's findings and how many diary entries were malformed (skipped)."""
    from bursts.models import AgentStatus
    from psychonauts.models import DiaryEntry

    runs = agent_runs(burst_id)
    results = failed_results(runs)
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
    failures: dict[tuple[str, str, str], Finding] = {}
    committed = _committed([r.pk for r in runs])
    for r in runs:
        if r.status != AgentStatus.ERROR or r.error.startswith(INFRASTRUCTURE):
            # Infrastructure that failed (a model server down, a context overflow) teaches
            # nothing about how agents should work.
            continue
        error = (r.error.strip().splitlines() or ["an unexplained error"])[0][:200]
        if results.get(r.pk, "").startswith(VERDICT_FAIL):
            # A reviewing role that failed a change did its job: the lesson is for the agents
            # whose work it failed, those of earlier stages that committed.
            makers = [
                m
                for m in runs
                if m.quantum_run_id == r.quantum_run_id
                and m.stage_index < r.stage_index
                and m.pk in committed
            ]
            for role in sorted({m.role for m in makers}):
                item = failures.setdefault(
                    (role, error, r.role), Finding("failed_review", error, role, [], r.role)
                )
                item.agent_run_ids.extend(m.pk for m in makers if m.role == role)
                item.agent_run_ids.append(r.pk)
            continue
        item = failures.setdefault((r.role, error, ""), Finding("failure", error, r.role, []))
        item.agent_run_ids.append(r.pk)
    found.extend(failures.values())
    return found, skipped


def window(run: ReflectionRun) -> tuple[datetime | None, datetime]:
    """The Tether's decisions a reflection run reads: those after the reflection before it
    started (all when it is the first), up to its own start."""
    before = (
        ReflectionRun.objects.filter(created_at__lt=run.created_at)
        .order_by("-created_at", "-pk")
        .values_list("created_at", flat=True)
        .first()
    )
    return before, run.created_at


def rejections(since: datetime | None, until: datetime, *, limit: int = 200) -> list[Finding]:
    """Changes and drifts the Tether rejected in the window, each a finding of the roles that
    made it: the agents that committed the change, the agent that assumed."""
    from bursts.models import AgentRun
    from tether.models import ChangeReview, ChangeStatus, Drift, DriftStatus

    window = {"decided_at__lte": until}
    if since is not None:
        window["decided_at__gt"] = since
    found: list[Finding] = []
    changes = list(
        ChangeReview.objects.filter(status=ChangeStatus.REJECTED, **window).order_by("decided_at")[
            :limit
        ]
    )
    agents = list(
        AgentRun.objects.filter(quantum_run_id__in=[c.quantum_run_id for c in changes]).values_list(
            "pk", "quantum_run_id", "role"
        )
    )
    committed = _committed([pk for pk, _, _ in agents])
    for change in changes:
        mine = [(pk, role) for pk, run_id, role in agents if run_id == change.quantum_run_id]
        makers = [(pk, role) for pk, role in mine if pk in committed] or mine
        reason = (change.comment.strip().splitlines() or ["no reason given"])[0][:200]
        for role in sorted({role for _, role in makers}):
            found.append(
                Finding(
                    "rejected_change",
                    reason,
                    role,
                    [pk for pk, r in makers if r == role],
                )
            )
    for drift in (
        Drift.objects.filter(status=DriftStatus.REJECTED, agent_run__isnull=False, **window)
        .select_related("agent_run")
        .order_by("decided_at")[:limit]
    ):
        assert drift.agent_run is not None
        reason = (drift.comment.strip().splitlines() or ["no reason given"])[0][:200]
        assumption = " ".join(drift.assumption.split())[:200]
        found.append(
            Finding(
                "rejected_drift",
                f"assuming {assumption} (the Tether rejected it: {reason})",
                drift.agent_run.role,
                [drift.agent_run_id] if drift.agent_run_id else [],
            )
        )
    return found


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
    if item.kind == "failed_review":
        return f"Avoid: {item.text} (failed by the {item.by})", RuleKind.ANTI_PATTERN
    if item.kind == "rejected_change":
        return f"Avoid: {item.text} (a change the Tether rejected)", RuleKind.ANTI_PATTERN
    if item.kind == "rejected_drift":
        return f"Avoid: {item.text}", RuleKind.ANTI_PATTERN
    retries = len(item.agent_run_ids)
    return (
        f"Avoid: {item.text} ({item.role}, failed {retries} time{'s' * (retries != 1)})",
        RuleKind.ANTI_PATTERN,
    )
