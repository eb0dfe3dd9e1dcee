"""The only writer of PlaybookRule, PlaybookDelta and RuleConfidencePoint: rules created,
changed through deltas, moved by feedback (confidence, counts, maturity) and decayed by time;
a confidence point recorded at each creation and feedback.

Confidence lives in [0, 1]. Feedback first decays it to the present, then moves it a step
toward 1 (helpful) or 0 (harmful); without feedback it halves every REFLECTION_HALF_LIFE_DAYS.
Maturity follows the counts and confidence on feedback (REFLECTION_PROMOTE_* up,
REFLECTION_DEMOTE_BELOW down to deprecated); decay alone never deprecates a rule.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, FloatField, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from reflection.errors import IllegalTransition, InvalidRule, NotFound
from reflection.models import (
    DELTA_TRANSITIONS,
    ConfidenceCause,
    DeltaOp,
    DeltaStatus,
    PlaybookDelta,
    PlaybookRule,
    RuleConfidencePoint,
    RuleKind,
    RuleMaturity,
    RuleScope,
)

logger = logging.getLogger(__name__)

# How far one feedback moves confidence toward 1 or 0 (an exponential moving average).
FEEDBACK_STEP = 0.2
SECONDS_PER_DAY = 86400.0


# --- pure arithmetic --------------------------------------------------------------------------


def confidence_decayed(
    confidence: float, since: datetime | None, now: datetime, half_life_days: float
) -> float:
    """`confidence` as it stood at `since`, decayed to `now`: halved per half-life elapsed
    (unchanged without a `since` or when `now` is not after it)."""
    if since is None or now <= since:
        return confidence
    days = (now - since).total_seconds() / SECONDS_PER_DAY
    return float(confidence * 0.5 ** (days / half_life_days))


def confidence_after(confidence: float, *, success: bool, step: float = FEEDBACK_STEP) -> float:
    """One feedback's move: a step of the way toward 1 (success) or 0 (failure)."""
    target = 1.0 if success else 0.0
    return min(1.0, max(0.0, confidence + (target - confidence) * step))


def maturity_after(maturity: str, *, helpful: int, confidence: float, success: bool) -> str:
    """A rule's maturity after a feedback, by the REFLECTION_PROMOTE_* and
    REFLECTION_DEMOTE_BELOW settings: promoted on success, deprecated on a harmful feedback
    that leaves it below the floor; deprecated stays deprecated."""
    if maturity == RuleMaturity.DEPRECATED:
        return maturity
    if not success:
        if confidence < settings.REFLECTION_DEMOTE_BELOW:
            return RuleMaturity.DEPRECATED
        return maturity
    proven_helpful, proven_confidence = settings.REFLECTION_PROMOTE_PROVEN
    established_helpful, established_confidence = settings.REFLECTION_PROMOTE_ESTABLISHED
    if helpful >= proven_helpful and confidence >= proven_confidence:
        return RuleMaturity.PROVEN
    if maturity == RuleMaturity.CANDIDATE and (
        helpful >= established_helpful and confidence >= established_confidence
    ):
        return RuleMaturity.ESTABLISHED
    return maturity


def is_anti_pattern(*, failures: int, successes: int, min_failures: int | None = None) -> bool:
    """Whether a rule's record inverts it: it failed at least REFLECTION_ANTI_PATTERN_MIN_FAILURES
    times and more than twice as often as it helped."""
    floor = settings.REFLECTION_ANTI_PATTERN_MIN_FAILURES if min_failures is None else min_failures
    return failures >= floor and failures > 2 * successes


def anti_pattern_of(rule: PlaybookRule) -> str:
    """The rule's text turned into its anti-pattern."""
    text = rule.text.strip()
    return text if text.startswith("Avoid: ") else f"Avoid: {text}"


# --- rules ------------------------------------------------------------------------------------


def _clean_text(text: str) -> str:
    cleaned = text.strip()
    if not cleaned:
        raise InvalidRule("a rule's text must not be empty")
    return cleaned


def rule_create(
    *,
    text: str,
    kind: str = RuleKind.RULE,
    scope: str = RuleScope.PROJECT,
    roles: Sequence[str] = (),
    labels: Sequence[str] = (),
    paths: Sequence[str] = (),
    evidence_event_ids: Sequence[int] = (),
    evidence_agent_run_ids: Sequence[int] = (),
    created_by: str = "",
) -> PlaybookRule:
    if kind not in RuleKind.values:
        raise InvalidRule(f"unknown rule kind {kind!r}")
    if scope not in RuleScope.values:
        raise InvalidRule(f"unknown rule scope {scope!r}")
    with transaction.atomic():
        rule = PlaybookRule.objects.create(
            text=_clean_text(text),
            kind=kind,
            scope=scope,
            roles=list(roles),
            labels=list(labels),
            paths=list(paths),
            evidence_event_ids=list(evidence_event_ids),
            evidence_agent_run_ids=list(evidence_agent_run_ids),
            created_by=created_by[:200],
        )
        RuleConfidencePoint.objects.create(
            rule=rule,
            confidence=rule.confidence,
            at=rule.confidence_at,
            cause=ConfidenceCause.CREATED,
        )
    return rule


@transaction.atomic
def rule_feedback(rule_id: int, success: bool, now: datetime | None = None) -> PlaybookRule:
    """Count one helpful (success) or harmful feedback on the rule: its confidence decayed to
    `now` and moved a step, its maturity promoted or deprecated by the settings. A rule whose
    record turns it into an anti-pattern gets an `add` delta proposing the inversion (once)."""
    now = now or timezone.now()
    rule = PlaybookRule.objects.select_for_update().filter(pk=rule_id).first()
    if rule is None:
        raise NotFound(f"no rule #{rule_id}")
    confidence = confidence_decayed(
        rule.confidence, rule.confidence_at, now, settings.REFLECTION_HALF_LIFE_DAYS
    )
    confidence = confidence_after(confidence, success=success)
    helpful = rule.helpful + (1 if success else 0)
    harmful = rule.harmful + (0 if success else 1)
    maturity_before = rule.maturity
    maturity = maturity_after(
        maturity_before, helpful=helpful, confidence=confidence, success=success
    )
    PlaybookRule.objects.filter(pk=rule_id).update(
        confidence=confidence,
        confidence_at=now,
        helpful=helpful,
        harmful=harmful,
        maturity=maturity,
        last_feedback_at=now,
        updated_at=now,
    )
    RuleConfidencePoint.objects.create(
        rule_id=rule_id,
        confidence=confidence,
        at=now,
        cause=ConfidenceCause.SUCCESS if success else ConfidenceCause.FAILURE,
    )
    rule.refresh_from_db()
    if (
        not success
        and rule.kind == RuleKind.RULE
        and is_anti_pattern(failures=harmful, successes=helpful)
        and not PlaybookDelta.objects.filter(
            op=DeltaOp.ADD, kind=RuleKind.ANTI_PATTERN, status=DeltaStatus.PROPOSED, rule=rule
        ).exists()
    ):
        anti_pattern_propose(
            rule, reason=f"rule #{rule.pk} was harmful {harmful} times, helpful {helpful}"
        )
    if maturity != maturity_before:
        logger.info(
            "rule %s: maturity %s -> %s (confidence %.3f)",
            rule_id,
            maturity_before,
            maturity,
            confidence,
            extra={"rule_id": rule_id, "maturity": maturity, "confidence": confidence},
        )
    return rule


def rules_decay(now: datetime | None = None) -> int:
    """Decay every live rule's confidence to `now` in one UPDATE (the beat's daily sweep):
    halved per REFLECTION_HALF_LIFE_DAYS since its `confidence_at`. Returns the rows changed.
    It records no confidence point: decay is the half-life from the last point, which readers
    recompute."""
    now = now or timezone.now()
    half_life_s = settings.REFLECTION_HALF_LIFE_DAYS * SECONDS_PER_DAY
    factor = RawSQL(
        "power(0.5::float8, extract(epoch from (%s - confidence_at))::float8 / %s)",
        (now, half_life_s),
        output_field=FloatField(),
    )
    return (
        PlaybookRule.objects.exclude(maturity=RuleMaturity.DEPRECATED)
        .filter(confidence_at__lt=now)
        .update(confidence=F("confidence") * factor, confidence_at=now)
    )


# --- deltas -----------------------------------------------------------------------------------


def _delta_create(
    *,
    op: str,
    rule_id: int | None,
    scope: str = RuleScope.PROJECT,
    text: str,
    kind: str,
    roles: Sequence[str],
    labels: Sequence[str],
    paths: Sequence[str],
    evidence_event_ids: Sequence[int],
    evidence_agent_run_ids: Sequence[int],
    reason: str = "",
    reflection_run_id: int | None = None,
) -> PlaybookDelta:
    return PlaybookDelta.objects.create(
        op=op,
        rule_id=rule_id,
        scope=scope,
        text=text.strip(),
        kind=kind,
        roles=list(roles),
        labels=list(labels),
        paths=list(paths),
        evidence_event_ids=list(evidence_event_ids),
        evidence_agent_run_ids=list(evidence_agent_run_ids),
        reason=reason,
        reflection_run_id=reflection_run_id,
    )


def anti_pattern_propose(
    rule: PlaybookRule, *, reason: str, reflection_run_id: int | None = None
) -> PlaybookDelta:
    """Propose turning the rule into its anti-pattern: an `add` delta of kind anti_pattern that
    names the rule and carries its scope, roles, labels, paths and evidence (applied, it
    deprecates the rule)."""
    return _delta_create(
        op=DeltaOp.ADD,
        rule_id=rule.pk,
        scope=rule.scope,
        text=anti_pattern_of(rule),
        kind=RuleKind.ANTI_PATTERN,
        roles=rule.roles,
        labels=rule.labels,
        paths=rule.paths,
        evidence_event_ids=rule.evidence_event_ids,
        evidence_agent_run_ids=rule.evidence_agent_run_ids,
        reason=reason,
        reflection_run_id=reflection_run_id,
    )


def delta_propose(
    *,
    op: str,
    rule_id: int | None = None,
    scope: str = RuleScope.PROJECT,
    text: str = "",
    kind: str = RuleKind.RULE,
    roles: Sequence[str] = (),
    labels: Sequence[str] = (),
    paths: Sequence[str] = (),
    evidence_event_ids: Sequence[int] = (),
    evidence_agent_run_ids: Sequence[int] = (),
    reason: str = "",
    reflection_run_id: int | None = None,
) -> PlaybookDelta:
    """Propose a change of the playbook: an `add` brings its text, an `update` or
    `deprecate` names its rule (an `update` with text)."""
    if op not in DeltaOp.values:
        raise InvalidRule(f"unknown delta op {op!r}")
    if kind not in RuleKind.values:
        raise InvalidRule(f"unknown rule kind {kind!r}")
    if scope not in RuleScope.values:
        raise InvalidRule(f"unknown rule scope {scope!r}")
    if op in (DeltaOp.ADD, DeltaOp.UPDATE):
        text = _clean_text(text)
    if op != DeltaOp.ADD:
        if rule_id is None:
            raise InvalidRule(f"a {op} delta names its rule")
        if not PlaybookRule.objects.filter(pk=rule_id).exists():
            raise NotFound(f"no rule #{rule_id}")
    return _delta_create(
        op=op,
        rule_id=rule_id,
        scope=scope,
        text=text,
        kind=kind,
        roles=roles,
        labels=labels,
        paths=paths,
        evidence_event_ids=evidence_event_ids,
        evidence_agent_run_ids=evidence_agent_run_ids,
        reason=reason,
        reflection_run_id=reflection_run_id,
    )


@transaction.atomic
def delta_decide(
    delta_id: int, *, to: str, by: str, reason: str = "", now: datetime | None = None
) -> PlaybookDelta:
    """Decide a proposed delta (compare-and-set proposed -> accepted | grounded | rejected);
    an accepted or grounded one is applied to the playbook in the same transaction. Only the
    operator's grounding applies a global-scope delta. IllegalTransition when it was decided
    already, `to` is not a decision, or a global delta would be merely accepted."""
    now = now or timezone.now()
    delta = PlaybookDelta.objects.filter(pk=delta_id).first()
    if delta is None:
        raise NotFound(f"no delta #{delta_id}")
    if to not in DELTA_TRANSITIONS.get(delta.status, frozenset()):
        raise IllegalTransition(f"cannot move delta #{delta_id} from {delta.status} to {to}")
    if to == DeltaStatus.ACCEPTED and delta.scope == RuleScope.GLOBAL:
        raise IllegalTransition(f"delta #{delta_id} changes a global rule: it needs grounding")
    updated = PlaybookDelta.objects.filter(pk=delta_id, status=delta.status).update(
        status=to, decided_by=by[:200], decided_at=now, reason=reason or delta.reason
    )
    if updated != 1:
        raise IllegalTransition(f"delta #{delta_id} was decided meanwhile")
    delta.refresh_from_db()
    if to in (DeltaStatus.ACCEPTED, DeltaStatus.GROUNDED):
        _delta_apply(delta, now=now)
        delta.refresh_from_db()
    logger.info(
        "delta %s %s: %s by %s",
        delta_id,
        delta.op,
        to,
        by,
        extra={"delta_id": delta_id, "op": delta.op, "status": to},
    )
    return delta


@transaction.atomic
def deltas_reject(reasons: Mapping[int, str], *, by: str, now: datetime | None = None) -> int:
    """Reject many proposed deltas at once, each with its reason (its own when empty): one
    compare-and-set UPDATE proposed -> rejected, as delta_decide would for each. Rejecting
    applies nothing to the playbook. IllegalTransition, and none rejected, when any of them is
    gone or was decided already. Returns how many were rejected."""
    if not reasons:
        return 0
    now = now or timezone.now()
    reason = Case(
        *(When(pk=pk, then=Value(text) if text else F("reason")) for pk, text in reasons.items())
    )
    updated = PlaybookDelta.objects.filter(pk__in=reasons, status=DeltaStatus.PROPOSED).update(
        status=DeltaStatus.REJECTED, decided_by=by[:200], decided_at=now, reason=reason
    )
    if updated != len(reasons):
        raise IllegalTransition(
            f"{len(reasons) - updated} of {len(reasons)} deltas were gone or decided already"
        )
    for pk in reasons:
        logger.info(
            "delta %s: %s by %s",
            pk,
            DeltaStatus.REJECTED,
            by,
            extra={"delta_id": pk, "status": DeltaStatus.REJECTED},
        )
    return updated


def _delta_apply(delta: PlaybookDelta, *, now: datetime) -> None:
    if delta.op == DeltaOp.ADD:
        rule = rule_create(
            text=delta.text,
            kind=delta.kind,
            scope=delta.scope,
            roles=delta.roles,
            labels=delta.labels,
            paths=delta.paths,
            evidence_event_ids=delta.evidence_event_ids,
            evidence_agent_run_ids=delta.evidence_agent_run_ids,
            created_by=delta.decided_by,
        )
        # An inverted rule gives way to its anti-pattern.
        if delta.kind == RuleKind.ANTI_PATTERN and delta.rule_id is not None:
            PlaybookRule.objects.filter(pk=delta.rule_id).update(
                maturity=RuleMaturity.DEPRECATED, updated_at=now
            )
        PlaybookDelta.objects.filter(pk=delta.pk).update(rule=rule)
        return
    if delta.rule_id is None:
        # Its rule was deleted since: the decision rolls back with this error.
        raise NotFound(f"delta #{delta.pk}: its rule is gone")
    if delta.op == DeltaOp.UPDATE:
        PlaybookRule.objects.filter(pk=delta.rule_id).update(
            text=delta.text,
            kind=delta.kind,
            scope=delta.scope,
            roles=delta.roles,
            labels=delta.labels,
            paths=delta.paths,
            updated_at=now,
        )
    else:
        PlaybookRule.objects.filter(pk=delta.rule_id).update(
            maturity=RuleMaturity.DEPRECATED, updated_at=now
        )
