"""Correction quanta: new work filed when the operator corrects what an agent assumed or built."""

from __future__ import annotations

from django.db import transaction

from core.cli import shorten
from quanta.models import DependencyKind, Quantum, QuantumKind
from quanta.services import comment_add, dependency_add, quantum_create

CORRECTION_LABEL = "correction"


@transaction.atomic
def correction_file(*, quantum_id: int, title: str, body: str, by: str) -> Quantum:
    """A `correction` quantum linked `discovered-from` the affected quantum, with a comment on
    the affected one pointing at it. It carries the label `correction` (not the original's
    labels, which may force a script or a scope), and the original's priority."""
    original = Quantum.objects.only("priority", "repository_id").get(pk=quantum_id)
    correction = quantum_create(
        repository_id=original.repository_id,
        title=shorten(title, 200),
        body=body,
        kind=QuantumKind.CORRECTION,
        priority=original.priority,
        labels=[CORRECTION_LABEL],
    )
    dependency_add(
        quantum_id=correction.pk, depends_on_id=quantum_id, kind=DependencyKind.DISCOVERED_FROM
    )
    comment_add(
        quantum_id=quantum_id,
        body=f"Correction filed as #{correction.pk} by {by}: {correction.title}",
        author="tether",
        author_kind="system",
    )
    return correction
