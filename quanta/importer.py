"""Bulk import of quanta from YAML or JSON lines: every problem reported, then all or nothing.

A record:

    ref: schema                 # optional local name other records may point at
    key: backlog/schema         # optional stable key (default: the ref), see below
    title: Design the schema    # required
    body, kind, priority, labels, pipeline, acceptance, verify_commands,
    complexity: trivial | standard | complex | auto (none: classified from title and body)
    status: open | deferred | blocked | closed      close_reason: why (for closed)
    parent: schema | 12         # a ref in this file, or the id of an existing quantum
    depends_on: [schema, 12]    # blocks edges; also `part_of`, `related`, `discovered_from`
    comments: ["text", {author: ada, body: "text"}]

A YAML file holds a list of records (or `quanta:` followed by one); a JSON-lines file holds one
JSON object per line. `quanta export` writes the same format, so export -> import round-trips.

Each record has a stable key: its `key`, else its `ref`, else its title (the n-th record of one
title: `title (n)`). It is imported once: importing it again updates the quantum its key names (the fields the record
gives, a missing parent, edge or comment) and leaves its status to the work and the operator.
The report says which were created, updated and left unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from django.db import connection, models, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from core.records import records_read
from core.safetext import quoted, text_problem
from core.safeyaml import InputRefused, LineMap, source_name
from quanta.complexity import complexity_classify
from quanta.errors import ImportFailed, InvalidQuantum, QuantaError
from quanta.events import quanta_event
from quanta.fields import FIELD_CHECKS
from quanta.models import AuthorKind, Comment, Dependency, DependencyKind, Quantum, QuantumStatus
from quanta.services import (
    QuantumChanges,
    comment_add,
    dependency_add,
    quanta_ids_allocate,
    quanta_rows_insert,
    quantum_update,
)

Ref = str | int
ID_MAX = 2**63 - 1  # ids are bigints
AUTHOR_MAX = Comment._meta.get_field("author").max_length or 200
ANALYZE_AFTER = 10_000  # rows imported at once: then the planner's statistics are refreshed
NOT_A_LIST = "expected a list of quanta (or 'quanta:' and a list)"

IMPORTABLE_STATUSES = [
    QuantumStatus.OPEN,
    QuantumStatus.DEFERRED,
    QuantumStatus.BLOCKED,
    QuantumStatus.CLOSED,
]
EDGE_FIELDS = {
    "depends_on": DependencyKind.BLOCKS,
    "part_of": DependencyKind.PARENT_CHILD,
    "related": DependencyKind.RELATED,
    "discovered_from": DependencyKind.DISCOVERED_FROM,
}
FIELD_OF_KIND: dict[str, str] = {kind: name for name, kind in EDGE_FIELDS.items()}
KNOWN_KEYS = {
    "ref",
    "key",
    "status",
    "close_reason",
    "parent",
    "comments",
    *FIELD_CHECKS,
    *EDGE_FIELDS,
}
KEY_MAX = 300  # characters of a record's `key` (a title, the fallback, may be longer)


@dataclass
class Record:
    where: str  # "file:line"
    ref: str | None
    fields: dict[str, Any]
    key: str = ""  # the stable key: `key`, else `ref`, else the title
    key_from_title: bool = False
    status: str = QuantumStatus.OPEN
    close_reason: str = ""
    parent: Ref | None = None
    edges: list[tuple[str, Ref]] = field(default_factory=list)  # (kind, target)
    comments: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, author, body)


def _ref(value: Any) -> Ref:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise InvalidQuantum(f"{quoted(value)} is neither a ref in this file nor a quantum id")
    if isinstance(value, int) and not 0 < value <= ID_MAX:
        raise InvalidQuantum(f"{quoted(value)} is not a quantum id (a positive number)")
    return value


def _field(key: str) -> str:
    """A key as a message names it: as written when short and printable, else quoted."""
    return key if len(key) <= 60 and key.isprintable() else quoted(key)


def _parse_record(name: str, line: int, raw: Any, problems: list[str]) -> Record | None:
    if not isinstance(raw, dict):
        problems.append(f"{name}:{line}: each quantum must be a mapping, got {type(raw).__name__}")
        return None
    lines: dict[str, int] = raw.lines if isinstance(raw, LineMap) else {}

    def where(key: str) -> str:
        return f"{name}:{lines.get(key, line)}"

    before = len(problems)
    for key in raw:
        if key not in KNOWN_KEYS:
            problems.append(f"{where(key)}: {_field(key)}: unknown field")
    if "title" not in raw:
        problems.append(f"{name}:{line}: title: required")
    ref = raw.get("ref")
    if ref is not None and (not isinstance(ref, str) or not ref):
        problems.append(f"{where('ref')}: ref: must be a non-empty string")
    record = Record(where=f"{name}:{line}", ref=ref if isinstance(ref, str) else None, fields={})
    key = raw.get("key", record.ref or "")
    if not isinstance(key, str) or ("key" in raw and not key.strip()):
        problems.append(f"{where('key')}: key: must be non-empty text")
    elif len(key) > KEY_MAX or text_problem(key):
        problems.append(f"{where('key')}: key: at most {KEY_MAX} printable characters")
    else:
        record.key = key.strip()
    for key, check in FIELD_CHECKS.items():
        if key in raw:
            try:
                record.fields[key] = check(raw[key])
            except InvalidQuantum as exc:
                problems.append(f"{where(key)}: {exc}")
    status = raw.get("status", QuantumStatus.OPEN)
    if status not in IMPORTABLE_STATUSES:
        problems.append(
            f"{where('status')}: status: must be one of {', '.join(IMPORTABLE_STATUSES)}; got {quoted(status)}"
        )
    else:
        record.status = str(status)
    reason = raw.get("close_reason", "")
    if not isinstance(reason, str):
        problems.append(f"{where('close_reason')}: close_reason: must be text")
    elif text_problem(reason):
        problems.append(f"{where('close_reason')}: close_reason: {text_problem(reason)}")
    else:
        record.close_reason = reason
    if not record.key and "title" in record.fields:
        record.key, record.key_from_title = record.fields["title"], True
    if record.status == QuantumStatus.CLOSED and not record.close_reason:
        record.close_reason = "imported closed"
    if raw.get("parent") is not None:
        try:
            record.parent = _ref(raw["parent"])
        except InvalidQuantum as exc:
            problems.append(f"{where('parent')}: parent: {exc}")
    for key, kind in EDGE_FIELDS.items():
        targets = raw.get(key) or []
        if not isinstance(targets, list):
            targets = [targets]
        for target in targets:
            try:
                record.edges.append((kind, _ref(target)))
            except InvalidQuantum as exc:
                problems.append(f"{where(key)}: {key}: {exc}")
    comments = raw.get("comments") or []
    if not isinstance(comments, list):
        problems.append(f"{where('comments')}: comments: must be a list")
        comments = []
    for comment in comments:
        if isinstance(comment, str) and comment.strip():
            body, author, author_kind = comment, "import", str(AuthorKind.OPERATOR)
        elif (
            isinstance(comment, dict)
            and isinstance(comment.get("body"), str)
            and comment["body"].strip()
        ):
            body, author = comment["body"], comment.get("author") or "import"
            author_kind = comment.get("author_kind", AuthorKind.OPERATOR)
            if author_kind not in AuthorKind.values:
                problems.append(
                    f"{where('comments')}: comments: author_kind must be one of {', '.join(AuthorKind.values)}"
                )
                continue
            if not isinstance(author, str) or len(author) > AUTHOR_MAX:
                problems.append(
                    f"{where('comments')}: comments: author must be text of up to {AUTHOR_MAX} characters"
                )
                continue
        else:
            problems.append(
                f"{where('comments')}: comments: each comment is text or {{author, body}}"
            )
            continue
        problem = text_problem(body) or text_problem(author)
        if problem is not None:
            problems.append(f"{where('comments')}: comments: a comment {problem}")
        else:
            record.comments.append((str(author_kind), author, body))
    return record if len(problems) == before else None


def _resolve(records: list[Record], problems: list[str]) -> dict[int, str]:
    """Check refs, existing ids, self-edges and cycles among the new `blocks` edges and parents.

    Returns the status of every existing quantum the file points at, read FOR SHARE so that none
    of them can be closed or reopened before the import commits (the blocker counts depend on it).
    """
    refs: dict[str, Record] = {}
    for record in records:
        if record.ref is None:
            continue
        if record.ref in refs:
            problems.append(
                f"{record.where}: ref: {quoted(record.ref)} is already used at {refs[record.ref].where}"
            )
        refs[record.ref] = record
    keys: dict[str, Record] = {}
    titles: dict[str, int] = {}
    for record in records:
        if record.key_from_title:
            # The n-th record of one title (n > 1) is keyed `title (n)`: the same file imported
            # again finds each of them.
            n = titles[record.key] = titles.get(record.key, 0) + 1
            record.key = record.key if n == 1 else f"{record.key} ({n})"
    for record in records:
        if record.key and record.key in keys:
            problems.append(
                f"{record.where}: key: {quoted(record.key)} is already used at "
                f"{keys[record.key].where}"
            )
        if record.key:
            keys[record.key] = record
    wanted_ids = {t for r in records for _, t in r.edges if isinstance(t, int)}
    wanted_ids |= {r.parent for r in records if isinstance(r.parent, int)}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, status FROM {Quantum._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR SHARE",
            [sorted(wanted_ids)],
        )
        existing: dict[int, str] = dict(cursor.fetchall())
    for record in records:
        pointers: list[tuple[str, Ref]] = (
            [("parent", record.parent)] if record.parent is not None else []
        )
        pointers += [(FIELD_OF_KIND[kind], target) for kind, target in record.edges]
        for label, target in pointers:
            if isinstance(target, int) and target not in existing:
                problems.append(f"{record.where}: {label}: no quantum #{target}")
            elif isinstance(target, str) and target not in refs:
                problems.append(
                    f"{record.where}: {label}: no record with ref {quoted(target)} in this file"
                )
            elif isinstance(target, str) and refs[target] is record:
                problems.append(f"{record.where}: {label}: a quantum cannot point at itself")
    if problems:
        return existing
    # Only edges between new records can form a cycle: existing quanta cannot point at new ones.
    graphs: tuple[tuple[str, set[str] | None], ...] = (
        ("depends_on", {DependencyKind.BLOCKS}),
        ("parent", None),
    )
    for label, kinds in graphs:
        graph: dict[int, list[int]] = {}
        index = {id(r): i for i, r in enumerate(records)}
        for i, record in enumerate(records):
            if kinds is None:
                local = [record.parent] if isinstance(record.parent, str) else []
            else:
                local = [t for k, t in record.edges if k in kinds and isinstance(t, str)]
            graph[i] = [index[id(refs[t])] for t in local]
        cycle = _find_cycle(graph)
        if cycle:
            names = " -> ".join(_field(records[i].ref or records[i].where) for i in cycle[:20])
            if len(cycle) > 20:
                names += f" -> … ({len(cycle)} in all)"
            problems.append(f"{records[cycle[0]].where}: {label}: cycle {names}")
    return existing


def _find_cycle(graph: dict[int, list[int]]) -> list[int] | None:
    """Iterative DFS; returns the nodes of one cycle (first repeated at the end) or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    for root in graph:
        if colour[root] != white:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[int] = []
        while stack:
            node, child = stack.pop()
            if child == 0:
                colour[node] = grey
                path.append(node)
            targets = graph[node]
            if child < len(targets):
                stack.append((node, child + 1))
                nxt = targets[child]
                if colour[nxt] == grey:
                    return [*path[path.index(nxt) :], nxt]
                if colour[nxt] == white:
                    stack.append((nxt, 0))
            else:
                colour[node] = black
                path.pop()
    return None


def parse_import(path: Path) -> tuple[list[Record], dict[int, str]]:
    """Read and validate the whole file; raises ImportFailed listing every problem.

    Returns the records and the statuses of the existing quanta they point at.
    """
    name = source_name(path)
    try:
        raws = records_read(path, key="quanta", not_a_list=NOT_A_LIST, sniff_jsonl=True)
    except InputRefused as exc:
        raise ImportFailed([exc.where(name)]) from None
    problems: list[str] = []
    records: list[Record] = []
    for line, raw in raws:
        record = _parse_record(name, line, raw, problems)
        if record is not None:
            records.append(record)
    existing: dict[int, str] = {}
    if not problems:
        existing = _resolve(records, problems)
    if problems:
        raise ImportFailed(problems)
    return records, existing


def _default(field_name: str) -> Any:
    model_field = Quantum._meta.get_field(field_name)
    assert isinstance(model_field, models.Field)
    return model_field.get_default()


def _complexity(fields: dict[str, Any]) -> tuple[str, bool]:
    """The record's complexity and whether the classifier set it (none given, or `auto`)."""
    if fields.get("complexity") is not None:
        return fields["complexity"], False
    return complexity_classify(fields["title"], fields.get("body") or "").complexity, True


@dataclass(frozen=True)
class ImportReport:
    """What an import did: every record's quantum in file order, and which were created,
    updated (some field, parent, edge or comment of the record was new) or left unchanged."""

    ids: list[int]
    created: list[int]
    updated: list[int]
    unchanged: list[int]

    def describe(self) -> str:
        parts = [f"created {len(self.created)}"]
        if self.updated or self.unchanged:
            parts += [f"updated {len(self.updated)}", f"unchanged {len(self.unchanged)}"]
        span = f" (#{min(self.created)}..#{max(self.created)})" if self.created else ""
        return f"imported {len(self.ids)} quanta: " + ", ".join(parts) + span


def quanta_import(*, path: Path, key_prefix: str = "") -> list[int]:
    """Import every record of the file, or nothing. Returns the ids in file order."""
    return quanta_import_report(path=path, key_prefix=key_prefix).ids


@transaction.atomic
def quanta_import_report(*, path: Path, key_prefix: str = "") -> ImportReport:
    """Import every record of the file, or nothing: a record whose key names a quantum already
    updates it, the others are created. `key_prefix` sets the records' keys apart (the demo
    imports a fresh set beside the earlier ones)."""
    records, existing = parse_import(path)
    if not records:
        return ImportReport([], [], [], [])
    for r in records:
        if r.key:
            r.key = key_prefix + r.key
    known = _known([r.key for r in records if r.key])
    fresh = [r for r in records if r.key not in known]
    again = [r for r in records if r.key in known]
    ids = quanta_ids_allocate(count=len(fresh)) if fresh else []
    by_ref = {r.ref: qid for r, qid in zip(fresh, ids, strict=True) if r.ref is not None}
    by_ref |= {r.ref: known[r.key].pk for r in again if r.ref is not None}
    status_of = {r.ref: r.status for r in fresh if r.ref is not None}
    status_of |= {r.ref: known[r.key].status for r in again if r.ref is not None}

    def resolve(target: Ref) -> int:
        return target if isinstance(target, int) else by_ref[target]

    def open_blockers(record: Record) -> int:
        targets = {t for k, t in record.edges if k == DependencyKind.BLOCKS}
        return sum(
            (existing[t] if isinstance(t, int) else status_of[t]) != QuantumStatus.CLOSED
            for t in targets
        )

    now = timezone.now()
    defaults = {f: _default(f) for f in FIELD_CHECKS if f != "complexity"}
    if fresh:
        quanta_rows_insert(
            quanta=(
                (
                    qid,
                    f["title"],
                    f["body"],
                    f["kind"],
                    r.status,
                    f["priority"],
                    f["labels"],
                    resolve(r.parent) if r.parent is not None else None,
                    f["pipeline"],
                    f["acceptance"],
                    f["verify_commands"],
                    *_complexity(f),
                    r.close_reason if r.status == QuantumStatus.CLOSED else "",
                    r.key,
                    now,
                    now,
                    now if r.status == QuantumStatus.CLOSED else None,
                    open_blockers(r),
                )
                for r, qid in zip(fresh, ids, strict=True)
                for f in ({**defaults, **r.fields},)
            ),
            dependencies=(
                (qid, resolve(target), kind, now)
                for r, qid in zip(fresh, ids, strict=True)
                for kind, target in dict.fromkeys(r.edges)  # the same edge twice is one edge
            ),
            comments=(
                (qid, kind, author, body, now)
                for r, qid in zip(fresh, ids, strict=True)
                for kind, author, body in r.comments
            ),
            analyze=len(ids) >= ANALYZE_AFTER,
        )
    edges_of, comments_of = _held([known[r.key].pk for r in again])
    updated = [
        pk
        for r in again
        for quantum in (known[r.key],)
        if (
            pk := _update(
                quantum,
                r,
                resolve,
                have=edges_of.get(quantum.pk, set()),
                said=comments_of.get(quantum.pk, set()),
            )
        )
        is not None
    ]
    changed = set(updated)
    created_of = {id(r): qid for r, qid in zip(fresh, ids, strict=True)}
    order = [created_of[id(r)] if id(r) in created_of else known[r.key].pk for r in records]
    report = ImportReport(
        ids=order,
        created=ids,
        updated=updated,
        unchanged=[known[r.key].pk for r in again if known[r.key].pk not in changed],
    )
    quanta_event(
        "quanta_imported",
        {
            "count": len(order),
            "created": len(report.created),
            "updated": len(report.updated),
            "file": source_name(path),
        },
    )
    return report


def _known(keys: list[str]) -> dict[str, Quantum]:
    """The quanta the keys name already, locked, by key. The keys go as one array: an IN list
    of one parameter per key stops at 65,535 parameters (a larger file could not be imported)
    and costs Django and psycopg Python work per key. `import_key <> ''` lets the planner use
    the partial index quantum_import_key."""
    if not keys:
        return {}
    keyed = RawSQL("SELECT unnest(%s::text[])", [keys])
    return {
        q.import_key: q
        for q in Quantum.objects.select_for_update()
        .exclude(import_key="")
        .filter(import_key__in=keyed)
    }


def _held(ids: list[int]) -> tuple[dict[int, set[tuple[int, str]]], dict[int, set[str]]]:
    """The edges (target, kind) and comment bodies the quanta have, by quantum: two statements
    for a whole re-import, not two per record."""
    edges: dict[int, set[tuple[int, str]]] = {}
    comments: dict[int, set[str]] = {}
    if not ids:
        return edges, comments
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT quantum_id, depends_on_id, kind FROM {Dependency._meta.db_table}"
            " WHERE quantum_id = ANY(%s)",
            [ids],
        )
        for quantum_id, target, kind in cursor.fetchall():
            edges.setdefault(quantum_id, set()).add((target, kind))
        cursor.execute(
            f"SELECT quantum_id, body FROM {Comment._meta.db_table} WHERE quantum_id = ANY(%s)",
            [ids],
        )
        for quantum_id, body in cursor.fetchall():
            comments.setdefault(quantum_id, set()).add(body)
    return edges, comments


def _update(
    quantum: Quantum,
    record: Record,
    resolve: Callable[[Ref], int],
    *,
    have: set[tuple[int, str]],
    said: set[str],
) -> int | None:
    """Bring an imported quantum in line with its record again, through the services (their
    checks: a new edge closing a cycle is refused); `have` and `said` are its edges and comment
    bodies. Its id when anything changed, else None."""
    changes: dict[str, Any] = {}
    for name, value in record.fields.items():
        if name == "complexity":
            if value is None and not quantum.complexity_auto:
                changes[name] = None
            elif value is not None and (quantum.complexity_auto or quantum.complexity != value):
                changes[name] = value
        elif getattr(quantum, name) != value:
            changes[name] = value
    parent = resolve(record.parent) if record.parent is not None else None
    moved = parent is not None and parent != quantum.parent_id
    try:
        if changes or moved:
            quantum_update(
                quantum_id=quantum.pk,
                changes=cast(QuantumChanges, changes),
                parent_id=parent if moved else None,
            )
        edges = [(resolve(t), kind) for kind, t in dict.fromkeys(record.edges)]
        added = [(t, kind) for t, kind in edges if (t, kind) not in have]
        for target, kind in added:
            dependency_add(quantum_id=quantum.pk, depends_on_id=target, kind=kind)
        new_comments = [c for c in record.comments if c[2].strip() not in said]
        for kind, author, body in new_comments:
            comment_add(quantum_id=quantum.pk, body=body, author=author, author_kind=kind)
    except QuantaError as exc:
        raise ImportFailed([f"{record.where}: {exc}"]) from None
    return quantum.pk if changes or moved or added or new_comments else None
