"""The evidence gate and curation: a proposal stands only on enough matching sessions; an
accepted one is not a duplicate or the opposite of a live rule; a rule whose record failed it
turns into its anti-pattern."""

from __future__ import annotations

from django.conf import settings

from core.search import sessions_count
from reflection.models import (
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleKind,
    RuleMaturity,
)
from reflection.services import playbook
from reflection.text import key_terms, normalise, polarity

CURATOR = "reflection"
EVIDENCE_LIMIT = 500  # sessions counted at most per proposal


def evidence_sessions(texts: list[str]) -> list[int]:
    """For each text, how many sessions support it: those with an event holding all of its
    key terms (at most EVIDENCE_LIMIT; 0 for a text without key terms). One statement for
    all the texts."""
    terms = [key_terms(text) for text in texts]
    counts = iter(sessions_count([" ".join(t) for t in terms if t], limit=EVIDENCE_LIMIT))
    return [next(counts) if t else 0 for t in terms]


def gate(run: ReflectionRun) -> int:
    """Reject the run's proposals that fewer than REFLECTION_EVIDENCE_MIN_SESSIONS sessions
    support, all in one write; the number rejected."""
    need = settings.REFLECTION_EVIDENCE_MIN_SESSIONS
    deltas = list(run.deltas.filter(status=DeltaStatus.PROPOSED).order_by("pk"))
    rejected: dict[int, str] = {}
    for delta, found in zip(deltas, evidence_sessions([d.text for d in deltas]), strict=True):
        if found < need:
            rejected[delta.pk] = (
                f"evidence gate: {found} matching session(s), {need} needed "
                f"(searched: {' '.join(key_terms(delta.text)) or 'nothing'})"
            )
    return playbook.deltas_reject(rejected, by=CURATOR)


def curate(run: ReflectionRun) -> dict[str, int]:
    """Decide the run's proposals the gate left: a duplicate of a live rule or of a proposal
    (another run's, or an earlier one of this run) and the opposite of one are rejected, a
    project-scope one accepted, a global one left for the operator; then every live rule whose
    record fails it is proposed as its anti-pattern (accepted when project-scope). Counts."""
    # The live rules' ids, texts and records only: every column of them (their JSON lists)
    # costs many times more to load. Full rows are read for the failing rules alone.
    live = list(
        PlaybookRule.objects.exclude(maturity=RuleMaturity.DEPRECATED).values_list(
            "pk", "text", "kind", "harmful", "helpful"
        )
    )
    failing = [
        pk
        for pk, _, kind, harmful, helpful in live
        if kind == RuleKind.RULE and playbook.is_anti_pattern(failures=harmful, successes=helpful)
    ]
    failing_rules = PlaybookRule.objects.in_bulk(failing)
    known: dict[str, str] = {normalise(text): f"rule #{pk}" for pk, text, *_ in live}
    known.update(
        (normalise(d.text), f"delta #{d.pk}")
        for d in PlaybookDelta.objects.filter(status=DeltaStatus.PROPOSED)
        .exclude(reflection_run=run)
        .exclude(text="")
    )
    poles = {polarity(text): f"rule #{pk}" for pk, text, *_ in live}
    accepted = duplicates = conflicts = waiting = inverted = 0
    rejected: dict[int, str] = {}  # written at once after the loop
    for delta in run.deltas.filter(status=DeltaStatus.PROPOSED).order_by("pk"):
        norm = normalise(delta.text)
        negative, core = polarity(delta.text)
        if norm in known:
            rejected[delta.pk] = f"duplicate of {known[norm]}"
            duplicates += 1
            continue
        if (not negative, core) in poles:
            rejected[delta.pk] = f"conflicts with {poles[(not negative, core)]}"
            conflicts += 1
            continue
        known[norm] = f"delta #{delta.pk}"
        poles[(negative, core)] = f"delta #{delta.pk}"
        if delta.scope != "project":
            waiting += 1  # a global change waits for the operator's grounding
            continue
        playbook.delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by=CURATOR, reason=delta.reason)
        accepted += 1
    playbook.deltas_reject(rejected, by=CURATOR)
    # Rules whose record failed them turn into their anti-pattern.
    for rule in (failing_rules[pk] for pk in failing if pk in failing_rules):
        text = playbook.anti_pattern_of(rule)
        if normalise(text) in known:
            continue
        delta = playbook.anti_pattern_propose(
            rule,
            reason=f"inverted: {rule.harmful} failures, {rule.helpful} successes",
            reflection_run_id=run.pk,
        )
        known[normalise(text)] = f"delta #{delta.pk}"
        if rule.scope == "project":
            playbook.delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by=CURATOR)
        inverted += 1
    return {
        "accepted": accepted,
        "duplicates": duplicates,
        "conflicts": conflicts,
        "waiting": waiting,
        "inverted": inverted,
    }
