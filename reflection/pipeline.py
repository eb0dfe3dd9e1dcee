"""The reflection pipeline over one burst: extracting -> proposing -> evaluating -> curating ->
completed, one function per stage (each a Celery task in reflection.tasks, or run in a row by
`reflect_burst`).

Extraction is deterministic: the burst's agent runs' own diary entries (written through the
`diary` tool) and their failures. Proposals, the evidence gate and curation are text rules;
each stage moves the run with a guarded transition, publishes `reflection:<stage>` and stores
its timing and counts on the run. A stage that fails moves the run to `error` with the reason
and returns None: reflection never raises into the wave.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.events import publish
from core.search import sessions_search
from reflection.models import (
    REFLECTION_RUN_TERMINAL,
    DeltaOp,
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    ReflectionRunStatus,
    RuleKind,
    RuleMaturity,
)
from reflection.services import playbook
from reflection.services.runs import reflection_run_start, reflection_run_transition

logger = logging.getLogger(__name__)

CURATOR = "reflection"
TEXT_MAX = 500  # characters: a diary entry longer than this is malformed and skipped
EVIDENCE_EVENTS = 5  # event ids kept per agent run as a proposal's evidence
KEY_TERMS = 3
_STOP = frozenset(
    [
        "the",
        "a",
        "an",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "for",
        "with",
        "by",
        "at",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "not",
        "never",
        "always",
        "do",
        "does",
        "did",
        "don",
        "avoid",
        "should",
        "must",
        "when",
        "then",
        "than",
        "into",
        "as",
        "use",
        "using",
    ]
)
_NEGATION = re.compile(r"^(never|do not|don't|dont|avoid:?|avoid)\s+")
_AFFIRM = re.compile(r"^(always|please)\s+")


@dataclass
class Finding:
    """One thing learned from the burst: a diary learning or challenge, or a failure."""

    kind: str  # learning | challenge | failure
    text: str
    role: str
    agent_run_ids: list[int] = field(default_factory=list)


# --- helpers ----------------------------------------------------------------------------------


def _stage(run: ReflectionRun, to: str, started: float, **counts: int) -> ReflectionRun:
    timings = {**run.timings, run.status: round(time.monotonic() - started, 4)}
    moved = reflection_run_transition(run.pk, to, timings=timings, counts={**run.counts, **counts})
    publish(
        f"reflection:{to}",
        "reflection_stage",
        {"reflection_run": run.pk, "burst": run.burst_id, "status": to, "counts": moved.counts},
    )
    return moved


def _guarded(
    stage: str, body: Callable[[ReflectionRun], ReflectionRun]
) -> Callable[[int | None], int | None]:
    """The stage as a function of the run id: it runs only when the run stands at the status
    before `stage`; any exception moves the run to error with the reason, never raised."""

    def run_stage(run_id: int | None) -> int | None:
        if run_id is None:
            return None
        run = ReflectionRun.objects.filter(pk=run_id).first()
        if run is None or run.status in REFLECTION_RUN_TERMINAL or run.status == "error":
            return None
        try:
            return body(run).pk
        except Exception as exc:  # reflection never fails the wave
            logger.exception("reflection %s failed in %s", run_id, stage)
            _fail(run_id, f"{stage}: {type(exc).__name__}: {exc}")
            return None

    run_stage.__name__ = stage
    return run_stage


def _fail(run_id: int, reason: str) -> None:
    try:
        reflection_run_transition(run_id, ReflectionRunStatus.ERROR, error=reason[:2000])
        publish("reflection:error", "reflection_stage", {"reflection_run": run_id, "error": reason})
    except Exception:  # already terminal or gone: nothing left to record
        logger.warning("reflection %s: could not record its error %s", run_id, reason)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def polarity(text: str) -> tuple[bool, str]:
    """(negative, core): "never X" / "do not X" / "Avoid: X" are negative, "always X" / "X"
    positive, and both share the core "x"."""
    lowered = " ".join(text.lower().strip().split())
    negative = bool(_NEGATION.match(lowered))
    lowered = _NEGATION.sub("", lowered) if negative else _AFFIRM.sub("", lowered)
    return negative, normalise(lowered)


def key_terms(text: str) -> list[str]:
    words = [w for w in normalise(text).split() if w not in _STOP and len(w) > 2]
    seen: list[str] = []
    for word in sorted(words, key=len, reverse=True):
        if word not in seen:
            seen.append(word)
    return seen[:KEY_TERMS]


def _agent_runs(burst_id: int) -> list[Any]:
    from bursts.models import AgentRun

    return list(AgentRun.objects.filter(quantum_run__burst_id=burst_id).order_by("pk"))


def findings(burst_id: int) -> tuple[list[Finding], int]:
    """The burst's findings and how many diary entries were malformed (skipped)."""
    from bursts.models import AgentStatus
    from psychonauts.models import DiaryEntry

    runs = _agent_runs(burst_id)
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


def _evidence_events(agent_run_ids: list[int]) -> list[int]:
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


# --- stages -----------------------------------------------------------------------------------


def _extract(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    run = _stage(run, ReflectionRunStatus.EXTRACTING, started)
    assert run.burst_id is not None
    found, skipped = findings(run.burst_id)
    return _stage(
        run,
        ReflectionRunStatus.PROPOSING,
        started,
        agent_runs=len(_agent_runs(run.burst_id)),
        findings=len(found),
        skipped=skipped,
    )


def _propose(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    assert run.burst_id is not None
    found, _ = findings(run.burst_id)
    proposed = 0
    for item in found:
        text, kind = proposal_text(item)
        playbook.delta_propose(
            op=DeltaOp.ADD,
            text=text,
            kind=kind,
            roles=[item.role],
            evidence_agent_run_ids=item.agent_run_ids,
            evidence_event_ids=_evidence_events(item.agent_run_ids),
            reason=f"from a {item.kind}",
            reflection_run_id=run.pk,
        )
        proposed += 1
    return _stage(run, ReflectionRunStatus.EVALUATING, started, proposed=proposed)


def evidence_sessions(text: str) -> int:
    terms = key_terms(text)
    if not terms:
        return 0
    return len({hit.session_id for hit in sessions_search(" ".join(terms), limit=500)})


def _evaluate(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    need = settings.REFLECTION_EVIDENCE_MIN_SESSIONS
    rejected = 0
    for delta in run.deltas.filter(status=DeltaStatus.PROPOSED).order_by("pk"):
        found = evidence_sessions(delta.text)
        if found < need:
            playbook.delta_decide(
                delta.pk,
                to=DeltaStatus.REJECTED,
                by=CURATOR,
                reason=f"evidence gate: {found} matching session(s), {need} needed "
                f"(searched: {' '.join(key_terms(delta.text)) or 'nothing'})",
            )
            rejected += 1
    return _stage(run, ReflectionRunStatus.CURATING, started, unsupported=rejected)


def _curate(run: ReflectionRun) -> ReflectionRun:
    started = time.monotonic()
    live = list(PlaybookRule.objects.exclude(maturity=RuleMaturity.DEPRECATED))
    known: dict[str, str] = {normalise(r.text): f"rule #{r.pk}" for r in live}
    known.update(
        (normalise(d.text), f"delta #{d.pk}")
        for d in PlaybookDelta.objects.filter(status=DeltaStatus.PROPOSED)
        .exclude(reflection_run=run)
        .exclude(text="")
    )
    poles = {polarity(r.text): f"rule #{r.pk}" for r in live}
    accepted = duplicates = conflicts = waiting = inverted = 0
    for delta in run.deltas.filter(status=DeltaStatus.PROPOSED).order_by("pk"):
        norm = normalise(delta.text)
        negative, core = polarity(delta.text)
        if norm in known:
            playbook.delta_decide(
                delta.pk, to=DeltaStatus.REJECTED, by=CURATOR, reason=f"duplicate of {known[norm]}"
            )
            duplicates += 1
            continue
        if (not negative, core) in poles:
            playbook.delta_decide(
                delta.pk,
                to=DeltaStatus.REJECTED,
                by=CURATOR,
                reason=f"conflicts with {poles[(not negative, core)]}",
            )
            conflicts += 1
            continue
        known[norm] = f"delta #{delta.pk}"
        poles[(negative, core)] = f"delta #{delta.pk}"
        if delta.scope != "project":
            waiting += 1  # a global change waits for the operator's grounding
            continue
        playbook.delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by=CURATOR, reason=delta.reason)
        accepted += 1
    # Rules whose record failed them turn into their anti-pattern.
    for rule in live:
        if rule.kind != RuleKind.RULE or not playbook.is_anti_pattern(
            failures=rule.harmful, successes=rule.helpful
        ):
            continue
        text = playbook.anti_pattern_of(rule)
        if normalise(text) in known:
            continue
        delta = playbook.delta_propose(
            op=DeltaOp.ADD,
            rule_id=rule.pk,
            scope=rule.scope,
            text=text,
            kind=RuleKind.ANTI_PATTERN,
            roles=rule.roles,
            labels=rule.labels,
            paths=rule.paths,
            evidence_event_ids=rule.evidence_event_ids,
            evidence_agent_run_ids=rule.evidence_agent_run_ids,
            reason=f"inverted: {rule.harmful} failures, {rule.helpful} successes",
            reflection_run_id=run.pk,
        )
        known[normalise(text)] = f"delta #{delta.pk}"
        if rule.scope == "project":
            playbook.delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by=CURATOR)
        inverted += 1
    return _stage(
        run,
        ReflectionRunStatus.COMPLETED,
        started,
        accepted=accepted,
        duplicates=duplicates,
        conflicts=conflicts,
        waiting=waiting,
        inverted=inverted,
    )


extract = _guarded("extracting", _extract)
propose = _guarded("proposing", _propose)
evaluate = _guarded("evaluating", _evaluate)
curate = _guarded("curating", _curate)
STAGES = (extract, propose, evaluate, curate)


def start(burst_id: int) -> int | None:
    """The run to carry through the stages, or None when the burst was reflected on already
    (its run stays as stored) or is gone. An errored run is started again."""
    try:
        run, created = reflection_run_start(burst_id)
        if run.status == ReflectionRunStatus.ERROR:
            run = reflection_run_transition(run.pk, ReflectionRunStatus.STARTED, error="")
        elif not created:
            return None
        publish(
            "reflection:started", "reflection_stage", {"reflection_run": run.pk, "burst": burst_id}
        )
        return run.pk
    except Exception:  # reflection never fails the wave
        logger.exception("reflection of burst %s could not start", burst_id)
        return None


def reflect_burst(burst_id: int) -> tuple[ReflectionRun | None, bool]:
    """Reflect on the burst in-process, every stage in a row: (its run, cached). `cached` is
    True when the burst had been reflected on already and its stored result is returned."""
    run_id = start(burst_id)
    if run_id is None:
        return ReflectionRun.objects.filter(burst_id=burst_id).first(), True
    for stage in STAGES:
        stage(run_id)
    return ReflectionRun.objects.get(pk=run_id), False
