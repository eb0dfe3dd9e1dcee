"""The only writer of DiaryEntry: what an agent notes through its `diary` tool, and what the
reflector extracts from a finished run's session. Texts are stored redacted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.redaction import redact
from psychonauts.models import DiaryEntry, DiaryKind, DiarySource


@dataclass(frozen=True)
class DiaryNote:
    agent_run_id: int
    kind: str
    text: str


def diary_add(*, agent_run_id: int, kind: str, text: str) -> DiaryEntry:
    """An entry the agent wrote about its own run."""
    return DiaryEntry.objects.create(
        agent_run_id=agent_run_id, kind=DiaryKind(kind), text=redact(text)
    )


def diary_add_extracted(notes: Sequence[DiaryNote]) -> list[DiaryEntry]:
    """Entries the reflector extracted, in one insert."""
    return DiaryEntry.objects.bulk_create(
        DiaryEntry(
            agent_run_id=n.agent_run_id,
            kind=DiaryKind(n.kind),
            text=redact(n.text),
            source=DiarySource.REFLECTOR,
        )
        for n in notes
    )
