"""Reachings: an agent asks, waits suspended (no worker held), and is resumed exactly once, by
the answer or by the deadline (which records a drift). Late answers ground or supersede it."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from bursts.models import AGENT_TERMINAL, AgentRun, AgentStatus
from bursts.services import agent_resume
from core import metrics
from core.events import publish
from core.redaction import redact
from core.sql import sql_names
from psychonauts.errors import PsychonautError
from psychonauts.models import AgentTurn
from psychonauts.runtime.runs import tool_call_complete
from quanta.models import AuthorKind, QuantumStatus
from quanta.services import comment_add, quantum_reopen
from tether.errors import AlreadyDecided, InvalidInput, NotFound, QuestionWithdrawn, TetherError
from tether.events import REACHINGS_TOPIC, ReachingPayload, TetherEventType
from tether.models import Drift, DriftStatus, Priority, Reaching, ReachingStatus
from tether.queue import queue_push_unsafe, queue_remove_unsafe
from tether.services.drifts import drift_decide, drift_open_for_reaching

logger = logging.getLogger(__name__)

EXPIRE_TASK = "tether.reaching_expire"


def reaching_payload(r: Reaching) -> ReachingPayload:
    """What events say about a reaching (the UI's question card)."""
    return {
        "reaching_id": r.pk,
        "quantum_id": r.quantum_id,
        "agent_run_id": r.agent_run_id,
        "question": r.question,
        "priority": r.priority,
        "assumption": r.assumption,
        "deadline": r.deadline.isoformat(),
        "status": r.status,
    }


def _after_commit_queue(r: Reaching) -> None:
    from core.celery import app

    reaching_id, priority, deadline = r.pk, r.priority, r.deadline
    countdown = max(0.0, (deadline - timezone.now()).total_seconds())

    def send() -> None:
        queue_push_unsafe(reaching_id, priority, deadline)
        try:
            # The timer; the beat sweep expires it anyway if this message is lost.
            app.send_task(EXPIRE_TASK, args=(reaching_id,), countdown=countdown)
        except Exception:
            logger.warning("tether: could not schedule the timeout of reaching %s", reaching_id)

    transaction.on_commit(send)


def _turn_text(agent_run_id: int, turn_index: int) -> str:
    turn = AgentTurn.objects.filter(agent_run_id=agent_run_id, index=turn_index).first()
    if turn is None:
        return ""
    return "".join(b.get("text", "") for b in turn.assistant if b.get("type") == "text").strip()


@transaction.atomic
def reaching_ask(
    *,
    agent_run_id: int,
    quantum_id: int,
    tool_use_id: str,
    question: str,
    assumption: str,
    priority: str = Priority.NORMAL,
    timeout_s: float | None = None,
    context: str = "",
    turn_index: int = 0,
) -> Reaching:
    """Record an agent's question (once per tool call) and queue it after commit."""
    existing = Reaching.objects.filter(agent_run_id=agent_run_id, tool_use_id=tool_use_id).first()
    if existing is not None:
        return existing  # a re-executed tool call: same reaching, same deadline
    if not question.strip() or not assumption.strip():
        raise InvalidInput("a reaching needs a question and the assumption taken without answer")
    if priority not in Priority.values:
        raise InvalidInput(f"priority: one of {', '.join(Priority.values)}")
    limit = settings.TETHER_MAX_TIMEOUT_S
    timeout = min(max(timeout_s or settings.TETHER_DEFAULT_TIMEOUT_S, 0.5), limit)
    reaching = Reaching.objects.create(
        agent_run_id=agent_run_id,
        quantum_id=quantum_id,
        tool_use_id=tool_use_id,
        # An agent's words, stored and shown: redacted (the turn text already is).
        question=redact(question.strip()),
        assumption=redact(assumption.strip()),
        priority=priority,
        context=redact(context.strip()) or _turn_text(agent_run_id, turn_index),
        deadline=timezone.now() + timedelta(seconds=timeout),
    )
    publish(REACHINGS_TOPIC, TetherEventType.QUESTION_ASKED, reaching_payload(reaching))
    _after_commit_queue(reaching)
    return reaching


@transaction.atomic
def reaching_quarantine(*, quantum_id: int, history: str, failures: int) -> Reaching:
    """The burst manager blocked a quantum after repeated failures: ask the operator what to do
    (no agent waits on this one). One pending quarantine reaching per quantum."""
    existing = Reaching.objects.filter(
        quantum_id=quantum_id, agent_run__isnull=True, status=ReachingStatus.PENDING
    ).first()
    if existing is not None:
        return existing
    reaching = Reaching.objects.create(
        quantum_id=quantum_id,
        question=(
            f"Quantum #{quantum_id} failed {failures} times in a row and is blocked. "
            "What should happen? Answer `retry` to reopen it, or give instructions (kept as a "
            "comment on the quantum)."
        ),
        context=redact(history),
        priority=Priority.HIGH,
        assumption="it stays blocked until the operator decides",
        deadline=timezone.now() + timedelta(seconds=settings.TETHER_QUARANTINE_TIMEOUT_S),
    )
    publish(REACHINGS_TOPIC, TetherEventType.QUESTION_ASKED, reaching_payload(reaching))
    _after_commit_queue(reaching)
    return reaching


# --- answers ---------------------------------------------------------------------------------

_YES = frozenset(
    {
        "yes", "y", "yep", "yeah", "agree", "agreed", "i agree", "ok", "okay", "correct",
        "right", "sure", "confirmed", "confirm", "fine", "go ahead", "yes go ahead", "lgtm",
        "that's right", "thats right", "do that", "proceed", "as assumed",
    }
)  # fmt: skip


def normalise(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation or quotes."""
    return re.sub(r"\s+", " ", text.lower()).strip().strip(" .!,;:\"'`")


def answer_agrees(answer: str, assumption: str) -> bool:
    """A late answer agrees with the assumption when, normalised, it is the assumption itself or
    a plain yes (`yes`, `agreed`, `ok`, `lgtm` ...). Anything else — `yes, but ...` included — is
    treated as a correction: a human reads the correction quantum, a wrong grounding goes
    unnoticed."""
    said = normalise(answer)
    return said == normalise(assumption) or said.replace(",", "") in _YES


AnswerKind = Literal["answered", "late_grounded", "late_superseded", "quarantine"]


@dataclass(frozen=True)
class AnswerResult:
    kind: AnswerKind
    reaching_id: int
    resumed: bool = False
    drift_id: int | None = None
    correction_id: int | None = None


def _resume_with(reaching: Reaching, output: str) -> bool:
    """Record the pending tool call's result and wake the agent, in the caller's transaction:
    an answer racing the timeout resumes the agent exactly once (the reaching's compare-and-set
    already chose the winner; this commits or rolls back with it)."""
    if reaching.agent_run_id is None:
        return False
    try:
        tool_call_complete(
            agent_run_id=reaching.agent_run_id,
            tool_use_id=reaching.tool_use_id,
            output=output,
            is_error=False,
        )
    except PsychonautError as exc:
        # The agent was cancelled (or its call is gone): the answer stands, nobody to wake.
        logger.info("tether: reaching %s has no pending call to complete: %s", reaching.pk, exc)
        return False
    return agent_resume(agent_run_id=reaching.agent_run_id)


_FIELDS = Reaching._meta.concrete_fields
# Pending -> answered, guarded, returning the row: the compare-and-set and the read of what the
# answer needs (its events, the agent to wake) in one round trip. An operator answering a
# hundred questions a second pays this on every answer.
_ANSWER = """
UPDATE {table} SET {status} = %(answered)s, {answer} = %(answer)s, {answered_by} = %(by)s,
    {answered_at} = %(now)s
WHERE {id} = %(id)s AND {status} = %(pending)s
RETURNING {columns}
""".format(
    **sql_names(Reaching),
    columns=", ".join(f'"{f.column}"' for f in _FIELDS),
)


def _answered(*, reaching_id: int, answer: str, by: str, now: datetime) -> Reaching | None:
    """The reaching, moved pending -> answered; None when it was not pending (or is unknown)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _ANSWER,
            {
                "id": reaching_id,
                "answer": answer,
                "by": by,
                "now": now,
                "answered": ReachingStatus.ANSWERED.value,
                "pending": ReachingStatus.PENDING.value,
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    values = []
    for field, value in zip(_FIELDS, row, strict=True):
        for convert in field.get_db_converters(connection):
            value = convert(value, field, connection)
        values.append(value)
    return Reaching.from_db(connection.alias, [f.attname for f in _FIELDS], values)


@transaction.atomic
def reaching_answer(*, reaching_id: int, text: str, by: str = "operator") -> AnswerResult:
    """The operator's answer: resumes the waiting agent with it; after the timeout it is a late
    beacon (see `late_answer`). Unknown, cancelled or already answered: an error, no change."""
    if not text.strip():
        raise InvalidInput("the answer is empty")
    now = timezone.now()
    reaching = _answered(reaching_id=reaching_id, answer=text.strip(), by=by, now=now)
    if reaching is None:
        reaching = Reaching.objects.filter(pk=reaching_id).first()
        if reaching is None:
            raise NotFound(f"no reaching #{reaching_id}")
        if reaching.status == ReachingStatus.TIMED_OUT:
            return _late_answer(reaching, text.strip(), by)
        if reaching.status == ReachingStatus.WITHDRAWN:
            raise QuestionWithdrawn(
                f"reaching #{reaching_id} was withdrawn: {reaching.withdrawn_reason} "
                "Your answer was not applied; nothing changed."
            )
        raise AlreadyDecided(f"reaching #{reaching_id} is {reaching.status}; nothing changed")
    metrics.tether_waited((now - reaching.created_at).total_seconds(), outcome="answered")
    transaction.on_commit(lambda: queue_remove_unsafe([reaching_id]))
    publish(
        REACHINGS_TOPIC,
        TetherEventType.QUESTION_ANSWERED,
        {**reaching_payload(reaching), "answer": text},
    )
    if reaching.agent_run_id is None:
        return _quarantine_answered(reaching, text.strip(), by)
    resumed = _resume_with(reaching, f"The Tether answered: {text.strip()}")
    return AnswerResult("answered", reaching_id, resumed=resumed)


def _quarantine_answered(reaching: Reaching, text: str, by: str) -> AnswerResult:
    comment_add(
        quantum_id=reaching.quantum_id, body=f"The Tether on the quarantine: {text}", author=by
    )
    if normalise(text) in {"retry", "reopen", "try again"}:
        try:
            quantum_reopen(quantum_id=reaching.quantum_id, reason="the Tether asked for a retry")
        except Exception as exc:  # the quantum moved on meanwhile: the comment says enough
            logger.info("tether: could not reopen #%s: %s", reaching.quantum_id, exc)
    return AnswerResult("quarantine", reaching.pk)


def _late_answer(reaching: Reaching, text: str, by: str) -> AnswerResult:
    now = timezone.now()
    if (
        Reaching.objects.filter(
            pk=reaching.pk, status=ReachingStatus.TIMED_OUT, late_answered_at__isnull=True
        ).update(late_answer=text, late_answered_by=by, late_answered_at=now)
        != 1
    ):
        raise AlreadyDecided(f"reaching #{reaching.pk} already has a late answer; nothing changed")
    publish(
        REACHINGS_TOPIC,
        TetherEventType.LATE_ANSWER_RECEIVED,
        {**reaching_payload(reaching), "answer": text},
    )
    drift = Drift.objects.filter(reaching=reaching).first()
    if drift is None:  # a quarantine reaching has no drift: keep the answer as instructions
        comment_add(quantum_id=reaching.quantum_id, body=f"The Tether (late): {text}", author=by)
        return AnswerResult("quarantine", reaching.pk)
    if answer_agrees(text, reaching.assumption):
        drift_decide(
            drift_id=drift.pk,
            to=DriftStatus.GROUNDED,
            comment=f"late answer agrees with the assumption: {text}",
            by=by,
        )
        return AnswerResult("late_grounded", reaching.pk, drift_id=drift.pk)
    decided = drift_decide(
        drift_id=drift.pk,
        to=DriftStatus.SUPERSEDED,
        comment=f"late answer: {text}",
        by=by,
        correction=text,
    )
    return AnswerResult(
        "late_superseded", reaching.pk, drift_id=drift.pk, correction_id=decided.correction_id
    )


# --- deadlines -------------------------------------------------------------------------------


@transaction.atomic
def reaching_expire(*, reaching_id: int, now: datetime | None = None) -> bool:
    """Past its deadline and still pending: time it out, record the drift, resume the agent on
    its assumption. Idempotent (the timer task and the beat sweep both call it)."""
    now = now or timezone.now()
    if (
        Reaching.objects.filter(
            pk=reaching_id, status=ReachingStatus.PENDING, deadline__lte=now
        ).update(status=ReachingStatus.TIMED_OUT)
        != 1
    ):
        return False
    reaching = Reaching.objects.get(pk=reaching_id)
    waited = (now - reaching.created_at).total_seconds()
    metrics.tether_waited(waited, outcome="timed_out")
    transaction.on_commit(lambda: queue_remove_unsafe([reaching_id]))
    publish(REACHINGS_TOPIC, TetherEventType.QUESTION_TIMED_OUT, reaching_payload(reaching))
    if reaching.agent_run_id is None:
        return True  # quarantine: the quantum simply stays blocked; nobody built on anything
    drift = drift_open_for_reaching(reaching=reaching)
    _resume_with(
        reaching,
        f"No answer from the Tether within {waited:.0f} s. Proceed on your stated assumption: "
        f"{reaching.assumption} (recorded as drift #{drift.pk}; the operator may correct it "
        "later).",
    )
    return True


# --- withdrawal ------------------------------------------------------------------------------


def reachings_withdraw_for_status(quantum_ids: Sequence[int], to: str) -> list[int]:
    """The quanta left the state a quarantine question asked about (blocked): each such question,
    pending or timed out without a late answer, is withdrawn with the reason, in the caller's
    transaction, so that a later answer (`retry`) cannot act on a quantum that moved on.
    Returns the reachings withdrawn."""
    if to == QuantumStatus.BLOCKED:
        return []
    open_questions = Reaching.objects.filter(
        quantum_id__in=list(quantum_ids), agent_run__isnull=True
    ).filter(
        Q(status=ReachingStatus.PENDING)
        | Q(status=ReachingStatus.TIMED_OUT, late_answered_at__isnull=True)
    )
    withdrawn: list[int] = []
    for pk, quantum_id in open_questions.values_list("pk", "quantum_id"):
        reason = (
            f"quantum #{quantum_id} is {to} now, no longer blocked; the question about its "
            "quarantine no longer applies."
        )
        if (
            Reaching.objects.filter(
                pk=pk, status__in=[ReachingStatus.PENDING, ReachingStatus.TIMED_OUT]
            ).update(status=ReachingStatus.WITHDRAWN, withdrawn_reason=reason)
            != 1
        ):
            continue
        withdrawn.append(pk)
        comment_add(
            quantum_id=quantum_id,
            body=f"The Tether's question #{pk} was withdrawn: {reason}",
            author="tether",
            author_kind=AuthorKind.SYSTEM,
        )
        publish(
            REACHINGS_TOPIC,
            TetherEventType.QUESTION_WITHDRAWN,
            {"reaching_id": pk, "quantum_id": quantum_id, "reason": reason},
        )
    if withdrawn:
        transaction.on_commit(lambda: queue_remove_unsafe(withdrawn))
    return withdrawn


def reachings_expire_due() -> list[int]:
    """Every pending reaching past its deadline (the beat safety net). Returns those expired."""
    now = timezone.now()
    due = list(
        Reaching.objects.filter(status=ReachingStatus.PENDING, deadline__lte=now)
        .order_by("deadline")
        .values_list("pk", flat=True)[:500]
    )
    return [pk for pk in due if reaching_expire(reaching_id=pk, now=now)]


@transaction.atomic
def reachings_cancel_orphans() -> list[int]:
    """Pending reachings whose agent ended without them (its wave was cancelled): cancelled,
    so the operator is not asked a question nobody waits for."""
    ids = list(
        Reaching.objects.filter(
            status=ReachingStatus.PENDING, agent_run__status__in=AGENT_TERMINAL
        ).values_list("pk", flat=True)
    )
    if ids:
        Reaching.objects.filter(pk__in=ids, status=ReachingStatus.PENDING).update(
            status=ReachingStatus.CANCELLED
        )
        transaction.on_commit(lambda: queue_remove_unsafe(ids))
        for pk in ids:
            publish(REACHINGS_TOPIC, TetherEventType.QUESTION_CANCELLED, {"reaching_id": pk})
    return ids


def agents_rewake(*, grace_s: float = 1.0) -> list[int]:
    """Wake agents left waiting although their reaching is resolved (lost wakeup).

    The answer may land between the tool creating the reaching and the runtime marking the agent
    waiting, or the runtime's own `running -> waiting` write may land just after the resume; in
    both cases the agent ends up waiting with its tool call completed. A waiting agent with no
    pending reaching left is resumed here (agent_resume is a compare-and-set: never twice).
    """
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    pending = Reaching.objects.filter(agent_run=OuterRef("pk"), status=ReachingStatus.PENDING)
    resolved = Reaching.objects.filter(
        agent_run=OuterRef("pk"), status__in=[ReachingStatus.ANSWERED, ReachingStatus.TIMED_OUT]
    )
    # Its ask_tether call leaves its turn incomplete; a run waiting for another reason (held by
    # a budget before a model call) has completed every turn, and is not the Tether's to wake.
    asking = AgentTurn.objects.filter(agent_run=OuterRef("pk"), complete=False)
    stranded = list(
        AgentRun.objects.filter(status=AgentStatus.WAITING, heartbeat_at__lt=cutoff)
        .filter(Exists(resolved), Exists(asking))
        .exclude(Exists(pending))
        .values_list("pk", flat=True)[:500]
    )
    woken = []
    for pk in stranded:
        with transaction.atomic():
            if agent_resume(agent_run_id=pk):
                woken.append(pk)
    if woken:
        logger.warning("tether: woke %s agents left waiting after their answer", len(woken))
    return woken


__all__ = [
    "AnswerResult",
    "TetherError",
    "agents_rewake",
    "answer_agrees",
    "reaching_answer",
    "reaching_ask",
    "reaching_expire",
    "reaching_quarantine",
    "reachings_cancel_orphans",
    "reachings_expire_due",
    "reachings_withdraw_for_status",
]
