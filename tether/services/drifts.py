"""Drifts, and the only module that writes them: a question or a pipeline proposal nobody
answered in time opens one; the operator grounds or rejects it, and may add notes to it at any
time (a note decides nothing); a late answer grounds or supersedes it; a change review records
what was built on it."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.events import publish
from tether.errors import AlreadyDecided, InvalidInput, NotFound
from tether.events import CHANGES_TOPIC, TetherEventType
from tether.models import Drift, DriftKind, DriftStatus, PipelineMutation, Reaching
from tether.services.corrections import correction_file

_EVENT: dict[str, TetherEventType] = {
    DriftStatus.GROUNDED: TetherEventType.DRIFT_CONFIRMED,
    DriftStatus.REJECTED: TetherEventType.DRIFT_REJECTED,
    DriftStatus.SUPERSEDED: TetherEventType.DRIFT_SUPERSEDED,
}


def drift_open_for_reaching(*, reaching: Reaching) -> Drift:
    """The drift of a question that timed out: the agent goes on with its assumption. The caller
    has just moved the reaching pending -> timed out (a compare-and-set), so this runs once per
    reaching; the one-to-one reaching column refuses a second drift anyway."""
    drift = Drift.objects.create(
        kind=DriftKind.ANSWER,
        reaching=reaching,
        agent_run_id=reaching.agent_run_id,
        quantum_id=reaching.quantum_id,
        assumption=reaching.assumption,
        rationale=reaching.context,
    )
    publish(
        CHANGES_TOPIC,
        TetherEventType.DRIFT_CREATED,
        {
            "drift_id": drift.pk,
            "kind": drift.kind,
            "reaching_id": reaching.pk,
            "quantum_id": drift.quantum_id,
            "agent_run_id": drift.agent_run_id,
            "assumption": drift.assumption,
        },
    )
    return drift


def drift_open_for_mutation(*, mutation: PipelineMutation) -> Drift:
    """The drift of a pipeline proposal that timed out: the pipeline stays at its version. The
    caller has just moved the proposal pending -> timed out (a compare-and-set)."""
    if mutation.quantum_id is None:
        raise InvalidInput(f"mutation #{mutation.pk} belongs to no quantum: no drift to record")
    drift = Drift.objects.create(
        kind=DriftKind.PIPELINE,
        mutation=mutation,
        agent_run_id=mutation.agent_run_id,
        quantum_id=mutation.quantum_id,
        assumption=(
            f"pipeline {mutation.pipeline_name} stays at version {mutation.base_version} "
            f"(proposal #{mutation.pk} was not answered)"
        ),
        rationale=mutation.rationale,
    )
    publish(
        CHANGES_TOPIC,
        TetherEventType.PIPELINE_DRIFT_CREATED,
        {
            "drift_id": drift.pk,
            "mutation_id": mutation.pk,
            "pipeline": mutation.pipeline_name,
            "quantum_id": drift.quantum_id,
            "assumption": drift.assumption,
        },
    )
    return drift


def drift_built_on_set(*, quantum_id: int, files: list[str], quanta: list[int]) -> int:
    """Record on a quantum's open drifts which files and later quanta now build on them (a new
    change review). Decided drifts keep what they had when decided. Returns how many changed."""
    return Drift.objects.filter(quantum_id=quantum_id, status=DriftStatus.OPEN).update(
        built_on={"files": files, "quanta": quanta}
    )


def _correction_body(drift: Drift, correction: str, verb: str) -> str:
    what = "pipeline" if drift.kind == DriftKind.PIPELINE else "answer"
    parts = [
        f"Drift #{drift.pk} on quantum #{drift.quantum_id} was {verb} by the Tether.",
        "",
        f"## Rejected assumption ({what})",
        drift.assumption,
    ]
    if drift.reaching_id is not None and drift.reaching is not None:
        parts += ["", "## The question", drift.reaching.question]
    if drift.rationale:
        parts += ["", "## The agent's rationale", drift.rationale]
    if drift.built_on:
        files = drift.built_on.get("files") or []
        quanta = drift.built_on.get("quanta") or []
        if files:
            parts += ["", "## Built on it (files)", *[f"- {f}" for f in files]]
        if quanta:
            parts += ["", "## Built on it (later quanta)", *[f"- #{q}" for q in quanta]]
    parts += ["", "## The operator's correction", correction]
    return "\n".join(parts)


@transaction.atomic
def drift_decide(
    *, drift_id: int, to: str, comment: str = "", by: str = "operator", correction: str = ""
) -> Drift:
    """open -> grounded | rejected | superseded. Rejected and superseded-with-a-
    correction file a correction quantum. Deciding twice is an error and changes nothing."""
    if to not in _EVENT:
        raise InvalidInput(f"a drift can become {', '.join(_EVENT)}, not {to!r}")
    if to == DriftStatus.REJECTED and not (correction or comment).strip():
        raise InvalidInput("say why the assumption is wrong (--reason)")
    now = timezone.now()
    updated = Drift.objects.filter(pk=drift_id, status=DriftStatus.OPEN).update(
        status=to, comment=comment.strip(), decided_by=by, decided_at=now
    )
    drift = Drift.objects.select_related("reaching").filter(pk=drift_id).first()
    if drift is None:
        raise NotFound(f"no drift #{drift_id}")
    if updated != 1:
        raise AlreadyDecided(f"drift #{drift_id} is already {drift.status}; nothing changed")
    text = (correction or comment).strip()
    if to == DriftStatus.REJECTED or (to == DriftStatus.SUPERSEDED and text):
        verb = "rejected" if to == DriftStatus.REJECTED else "contradicted by a late answer"
        filed = correction_file(
            quantum_id=drift.quantum_id,
            title=f"Correct #{drift.quantum_id}: not “{drift.assumption}”",
            body=_correction_body(drift, text, verb),
            by=by,
        )
        Drift.objects.filter(pk=drift.pk).update(correction=filed)
        drift.correction = filed
    publish(
        CHANGES_TOPIC,
        _EVENT[to],
        {
            "drift_id": drift.pk,
            "kind": drift.kind,
            "quantum_id": drift.quantum_id,
            "status": to,
            "comment": drift.comment,
            "by": by,
            "correction_id": drift.correction_id,
        },
    )
    return drift


def drift_ground(*, drift_id: int, by: str = "operator", comment: str = "") -> Drift:
    return drift_decide(drift_id=drift_id, to=DriftStatus.GROUNDED, comment=comment, by=by)


def drift_reject(*, drift_id: int, reason: str, by: str = "operator") -> Drift:
    return drift_decide(
        drift_id=drift_id, to=DriftStatus.REJECTED, comment=reason, by=by, correction=reason
    )


@transaction.atomic
def drift_note(*, drift_id: int, text: str, by: str = "operator") -> Drift:
    """Add the operator's note to a drift, open or decided; its status does not change (an open
    drift can still be grounded or rejected)."""
    if not text.strip():
        raise InvalidInput("the note is empty")
    drift = Drift.objects.select_for_update().filter(pk=drift_id).first()
    if drift is None:
        raise NotFound(f"no drift #{drift_id}")
    note = {"by": by, "at": timezone.now().isoformat(), "text": text.strip()}
    drift.notes = [*drift.notes, note]
    Drift.objects.filter(pk=drift_id).update(notes=drift.notes)
    publish(
        CHANGES_TOPIC,
        TetherEventType.DRIFT_NOTED,
        {
            "drift_id": drift.pk,
            "kind": drift.kind,
            "quantum_id": drift.quantum_id,
            "status": drift.status,
            "note": note["text"],
            "by": by,
        },
    )
    return drift
