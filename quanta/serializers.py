"""Plain-data views of quanta for --json output, export and events."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, TypedDict

import yaml

from quanta.models import Comment, Dependency, Quantum
from quanta.selectors import WhyNotReady, quanta_list


class QuantumData(TypedDict):
    id: int
    title: str
    body: str
    kind: str
    status: str
    priority: int
    labels: list[str]
    parent_id: int | None
    pipeline: str
    acceptance: str
    verify_commands: list[str]
    complexity: str
    complexity_auto: bool
    close_reason: str
    created_at: str
    updated_at: str
    closed_at: str | None


def quantum_data(q: Quantum) -> QuantumData:
    return {
        "id": q.pk,
        "title": q.title,
        "body": q.body,
        "kind": q.kind,
        "status": q.status,
        "priority": q.priority,
        "labels": list(q.labels),
        "parent_id": q.parent_id,
        "pipeline": q.pipeline,
        "acceptance": q.acceptance,
        "verify_commands": list(q.verify_commands),
        "complexity": q.complexity,
        "complexity_auto": q.complexity_auto,
        "close_reason": q.close_reason,
        "created_at": q.created_at.isoformat(),
        "updated_at": q.updated_at.isoformat(),
        "closed_at": q.closed_at.isoformat() if q.closed_at else None,
    }


def dependency_data(d: Dependency) -> dict[str, Any]:
    return {"quantum_id": d.quantum_id, "depends_on_id": d.depends_on_id, "kind": d.kind}


def comment_data(c: Comment) -> dict[str, Any]:
    return {
        "id": c.pk,
        "author_kind": c.author_kind,
        "author": c.author,
        "body": c.body,
        "created_at": c.created_at.isoformat(),
    }


def why_data(why: WhyNotReady) -> dict[str, Any]:
    return {
        "quantum_id": why.quantum_id,
        "ready": why.ready,
        "status": why.status,
        "reasons": why.reasons,
        "waits_on": why.direct,
        "blockers": [
            {"id": b.id, "title": b.title, "status": b.status, "waits_on": b.waits_on}
            for b in why.blockers.values()
        ],
        "explanation": why.describe(),
    }


EXPORT_EDGE_FIELDS = (
    ("depends_on", "blocks"),
    ("part_of", "parent-child"),
    ("related", "related"),
    ("discovered_from", "discovered-from"),
)


def export_record(
    q: Quantum, edges: list[Dependency], comments: list[Comment], exported: set[int]
) -> dict[str, Any]:
    """One record in the import format (see quanta.importer).

    Quanta in the same export are referred to as `q<id>`; others by their numeric id.
    """

    def ref(qid: int) -> str | int:
        return f"q{qid}" if qid in exported else qid

    record: dict[str, Any] = {
        "ref": f"q{q.pk}",
        **({"key": q.import_key} if q.import_key else {}),  # a re-import updates, not adds
        "title": q.title,
        "kind": q.kind,
        "status": q.status if q.status != "in_progress" else "open",
        "priority": q.priority,
        # Set by the classifier: imported, it is classified again (and stays automatic).
        "complexity": "auto" if q.complexity_auto else q.complexity,
    }
    optional = {
        "body": q.body,
        "labels": list(q.labels),
        "pipeline": q.pipeline,
        "acceptance": q.acceptance,
        "verify_commands": list(q.verify_commands),
        "close_reason": q.close_reason if q.status == "closed" else "",
        "parent": ref(q.parent_id) if q.parent_id else None,
    }
    record.update({k: v for k, v in optional.items() if v})
    for field, kind in EXPORT_EDGE_FIELDS:
        targets = [ref(e.depends_on_id) for e in edges if e.kind == kind]
        if targets:
            record[field] = targets
    if comments:
        record["comments"] = [
            {"author": c.author, "author_kind": c.author_kind, "body": c.body} for c in comments
        ]
    return record


EXPORT_FORMATS = ("yaml", "jsonl")


def quanta_export(*, status: str | None = None, fmt: str = "yaml") -> str:
    """Quanta (all, or those in `status`) as the text of an import file (`quanta.importer`).

    Shared by `manage.py quanta export` and the control room's download, so both write the same.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format: must be one of {', '.join(EXPORT_FORMATS)}")
    quanta = list(quanta_list(status=status).order_by("id"))
    ids = {q.pk for q in quanta}
    edges: dict[int, list[Dependency]] = defaultdict(list)
    for d in Dependency.objects.filter(quantum_id__in=ids).order_by("id"):
        edges[d.quantum_id].append(d)
    comments: dict[int, list[Comment]] = defaultdict(list)
    for c in Comment.objects.filter(quantum_id__in=ids).order_by("created_at", "id"):
        comments[c.quantum_id].append(c)
    records = [export_record(q, edges[q.pk], comments[q.pk], ids) for q in quanta]
    if fmt == "jsonl":
        return "".join(json.dumps(record) + "\n" for record in records)
    return str(yaml.safe_dump(records, sort_keys=False, allow_unicode=True))
