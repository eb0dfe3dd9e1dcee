"""Writes to quanta. Every status change is a compare-and-set; events go out after commit."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.redaction import redact
from quanta.complexity import complexity_classify
from quanta.errors import (
    DependencyCycle,
    DependencyNotFound,
    DuplicateDependency,
    IllegalTransition,
    InvalidQuantum,
    QuantumNotFound,
)
from quanta.events import QuantaEventType, quanta_event, quanta_events
from quanta.fields import check_text, clean_fields
from quanta.hooks import status_changed
from quanta.models import (
    AuthorKind,
    Comment,
    Dependency,
    DependencyKind,
    Quantum,
    QuantumStatus,
)
from repos.context import current
from repos.models import Repository
from repos.services import default_repository_id

logger = logging.getLogger(__name__)

S = QuantumStatus
AUTHOR_MAX = Comment._meta.get_field("author").max_length or 200

# A constant advisory-lock key: adding `blocks` edges is serialised so that two concurrent adds
# cannot each pass the cycle check and together close a cycle.
_BLOCKS_EDGE_LOCK = 0x5155414E  # "QUAN"


class QuantumChanges(TypedDict, total=False):
    title: str
    body: str
    kind: str
    priority: int
    labels: list[str]
    pipeline: str
    acceptance: str
    verify_commands: list[str]
    complexity: str | None  # None: the classifier decides (quanta.complexity)


def _quantum_event(event_type: QuantaEventType, quantum: Quantum, **extra: Any) -> None:
    quanta_event(
        event_type,
        {"quantum_id": quantum.pk, "title": quantum.title, "status": quantum.status, **extra},
    )


# The full-text vector of quantum `{q}`: title and labels (A), body (B) and all its comments (C).
SEARCH_VECTOR_SQL = """
    setweight(to_tsvector(%(cfg)s::regconfig, {q}.title), 'A')
    || setweight(to_tsvector(%(cfg)s::regconfig, array_to_string({q}.labels, ' ')), 'A')
    || setweight(to_tsvector(%(cfg)s::regconfig, {q}.body), 'B')
    || setweight(to_tsvector(%(cfg)s::regconfig, coalesce(
        (SELECT string_agg(c.body, ' ') FROM {comments} c WHERE c.quantum_id = {q}.id), '')), 'C')
"""


def _search_vector(alias: str) -> str:
    """The quantum's search vector in SQL, for the row aliased `alias`."""
    return SEARCH_VECTOR_SQL.format(q=alias, comments=Comment._meta.db_table)


def search_refresh(quantum_ids: Sequence[int]) -> None:
    """Recompute the full-text vectors of these quanta."""
    if not quantum_ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Quantum._meta.db_table} q SET search_vector = {_search_vector('q')}"
            " WHERE q.id = ANY(%(ids)s)",
            {"cfg": settings.SEARCH_CONFIG, "ids": list(quantum_ids)},
        )


def _require_quantum(quantum_id: int) -> Quantum:
    try:
        return Quantum.objects.get(pk=quantum_id)
    except Quantum.DoesNotExist:
        raise QuantumNotFound(f"no quantum #{quantum_id}") from None


def _check_parent(parent_id: int | None, *, child_id: int | None = None) -> None:
    if parent_id is None:
        return
    if child_id is not None and parent_id == child_id:
        raise InvalidQuantum("a quantum cannot be its own parent", field="parent")
    if not Quantum.objects.filter(pk=parent_id).exists():
        raise QuantumNotFound(f"parent: no quantum #{parent_id}")
    if child_id is not None:
        # Walk up from the new parent: finding the child there would make a loop of parents.
        seen: set[int] = set()
        cursor_id: int | None = parent_id
        while cursor_id is not None and cursor_id not in seen:
            if cursor_id == child_id:
                raise InvalidQuantum(f"#{parent_id} descends from #{child_id}", field="parent")
            seen.add(cursor_id)
            cursor_id = Quantum.objects.filter(pk=cursor_id).values_list("parent_id", flat=True)[0]


def _repository_for(repository_id: int | None, parent_id: int | None) -> int:
    if repository_id is not None:
        if not Repository.objects.filter(pk=repository_id, removed_at__isnull=True).exists():
            raise InvalidQuantum(f"no repository #{repository_id}")
        return repository_id
    if parent_id is not None:
        found = Quantum.objects.filter(pk=parent_id).values_list("repository_id", flat=True)
        if found:
            return found[0]
    return current().repository_id or default_repository_id()


@transaction.atomic
def quantum_create(
    *,
    title: str,
    body: str = "",
    kind: str = "task",
    priority: int = 2,
    labels: Iterable[str] = (),
    parent_id: int | None = None,
    pipeline: str = "",
    acceptance: str = "",
    verify_commands: Iterable[str] = (),
    complexity: str | None = None,
    depends_on: Iterable[int] = (),
    repository_id: int | None = None,
) -> Quantum:
    """A new quantum; `complexity` None (or "auto"): the classifier sets it from the title and
    body, and classifies it again when they change. Its repository: `repository_id`, else its
    parent's, else the one the caller works on (repos.context; the default one outside)."""
    fields = clean_fields(
        {
            "title": title,
            "body": body,
            "kind": kind,
            "priority": priority,
            "labels": list(labels),
            "pipeline": pipeline,
            "acceptance": acceptance,
            "verify_commands": list(verify_commands),
            "complexity": complexity,
        }
    )
    _check_parent(parent_id)
    fields["complexity_auto"] = fields["complexity"] is None
    if fields["complexity_auto"]:
        fields["complexity"] = complexity_classify(fields["title"], fields["body"]).complexity
    quantum = Quantum.objects.create(
        parent_id=parent_id, repository_id=_repository_for(repository_id, parent_id), **fields
    )
    for blocker_id in depends_on:
        dependency_add(quantum_id=quantum.pk, depends_on_id=blocker_id)
    search_refresh([quantum.pk])
    _quantum_event("quantum_created", quantum)
    return quantum


@transaction.atomic
def quantum_update(
    *,
    quantum_id: int,
    changes: QuantumChanges,
    parent_id: int | None = None,
    clear_parent: bool = False,
) -> Quantum:
    """Change fields (not status): `parent_id` sets the parent, `clear_parent` removes it."""
    quantum = _require_quantum(quantum_id)
    fields = clean_fields(dict(changes))
    if parent_id is not None and clear_parent:
        raise InvalidQuantum("give a new parent or clear it, not both", field="parent")
    if parent_id is not None:
        _check_parent(parent_id, child_id=quantum_id)
        fields["parent_id"] = parent_id
    elif clear_parent:
        fields["parent_id"] = None
    if not fields:
        raise InvalidQuantum("nothing to update: name at least one field")
    if "complexity" in fields:
        fields["complexity_auto"] = fields["complexity"] is None
    if fields.get("complexity_auto") or (
        "complexity" not in fields and quantum.complexity_auto and {"title", "body"} & fields.keys()
    ):
        fields["complexity"] = complexity_classify(
            fields.get("title", quantum.title), fields.get("body", quantum.body)
        ).complexity
    for name, value in fields.items():
        setattr(quantum, name, value)
    quantum.save(update_fields=[*fields, "updated_at"])
    if {"title", "body", "labels"} & fields.keys():
        search_refresh([quantum.pk])
    _quantum_event("quantum_updated", quantum, fields=sorted(fields))
    return quantum


def _transition(
    quantum_id: int, *, allowed_from: frozenset[str], to: str, verb: str, **fields: Any
) -> Quantum:
    """Compare-and-set the status; a count other than 1 becomes a precise error."""
    updated = Quantum.objects.filter(pk=quantum_id, status__in=allowed_from).update(
        status=to, updated_at=timezone.now(), **fields
    )
    if updated != 1:
        current = Quantum.objects.filter(pk=quantum_id).values_list("status", flat=True).first()
        if current is None:
            raise QuantumNotFound(f"no quantum #{quantum_id}")
        allowed = ", ".join(sorted(allowed_from))
        raise IllegalTransition(
            f"cannot {verb} quantum #{quantum_id}: it is {current} (only from {allowed})"
        )
    status_changed([quantum_id], to)
    return Quantum.objects.get(pk=quantum_id)


OPERATOR_CLOSABLE = frozenset({S.OPEN, S.BLOCKED, S.DEFERRED})


@transaction.atomic
def quantum_close(
    *, quantum_id: int, reason: str, allowed_from: frozenset[str] = OPERATOR_CLOSABLE
) -> Quantum:
    """Close with a reason. An in-progress quantum is closed only by the burst manager,
    which passes `allowed_from={in_progress}`."""
    if not reason.strip():
        raise InvalidQuantum("say why the quantum is closed", field="reason")
    check_text("reason", reason)
    quantum = _transition(
        quantum_id,
        allowed_from=allowed_from,
        to=S.CLOSED,
        verb="close",
        close_reason=reason.strip(),
        closed_at=timezone.now(),
    )
    _quantum_event("quantum_closed", quantum, reason=quantum.close_reason)
    return quantum


# `quantum_close` for many quanta in one statement: each row compares its status and takes its
# own reason (the arrays are zipped by unnest).
_CLOSE_MANY = f"""
UPDATE {Quantum._meta.db_table} AS q
SET status = 'closed', updated_at = %(now)s, close_reason = v.reason, closed_at = %(now)s
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS v(id, reason)
WHERE q.id = v.id AND q.status = ANY(%(allowed)s)
RETURNING q.id, q.title
"""


@transaction.atomic
def quanta_close(
    *, reasons: Mapping[int, str], allowed_from: frozenset[str] = OPERATOR_CLOSABLE
) -> list[int]:
    """Close many quanta, each with its reason (the burst manager's drain: one UPDATE and one
    INSERT of events instead of three statements per quantum). Returns the ids closed; one not
    in an allowed status is left as it is and missing from the list, for the caller to say so."""
    if any(not reason.strip() for reason in reasons.values()):
        raise InvalidQuantum("say why the quantum is closed", field="reason")
    if not reasons:
        return []
    ids = list(reasons)
    with connection.cursor() as cursor:
        cursor.execute(
            _CLOSE_MANY,
            {
                "now": timezone.now(),
                "ids": ids,
                "reasons": [reasons[i].strip() for i in ids],
                "allowed": sorted(allowed_from),
            },
        )
        closed = dict(cursor.fetchall())
    if not closed:
        return []
    status_changed(list(closed), S.CLOSED)
    quanta_events(
        [
            (
                "quantum_closed",
                {
                    "quantum_id": pk,
                    "title": closed[pk],
                    "status": S.CLOSED,
                    "reason": reasons[pk].strip(),
                },
            )
            for pk in ids
            if pk in closed
        ],
    )
    return [pk for pk in ids if pk in closed]


@transaction.atomic
def quantum_reopen(*, quantum_id: int, reason: str = "") -> Quantum:
    quantum = _transition(
        quantum_id,
        allowed_from=frozenset({S.CLOSED, S.DEFERRED, S.BLOCKED}),
        to=S.OPEN,
        verb="reopen",
        close_reason="",
        closed_at=None,
    )
    if reason.strip():
        comment_add(quantum_id=quantum_id, body=f"Reopened: {reason.strip()}", author="operator")
    _quantum_event("quantum_reopened", quantum)
    return quantum


@transaction.atomic
def quantum_defer(*, quantum_id: int) -> Quantum:
    quantum = _transition(
        quantum_id, allowed_from=frozenset({S.OPEN, S.BLOCKED}), to=S.DEFERRED, verb="defer"
    )
    _quantum_event("quantum_deferred", quantum)
    return quantum


def _cycle_path(*, start_id: int, target_id: int) -> list[int] | None:
    """A path of `blocks` edges from start to target, or None when target is unreachable.

    Reachability is a set-semantics recursive CTE (UNION), so it stays linear in the edges
    even where many paths cross; the path itself is then rebuilt from the reached edges.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE reach(src, dst) AS (
                SELECT quantum_id, depends_on_id FROM {Dependency._meta.db_table}
                 WHERE quantum_id = %(start)s AND kind = 'blocks'
                UNION
                SELECT d.quantum_id, d.depends_on_id
                  FROM reach r JOIN {Dependency._meta.db_table} d
                    ON d.quantum_id = r.dst AND d.kind = 'blocks'
            )
            SELECT src, dst FROM reach
            """,
            {"start": start_id},
        )
        edges = cursor.fetchall()
    came_from: dict[int, int] = {}
    adjacency: dict[int, list[int]] = {}
    for src, dst in edges:
        adjacency.setdefault(src, []).append(dst)
    frontier = [start_id]
    seen = {start_id}
    while frontier:
        nxt: list[int] = []
        for node in frontier:
            for dst in adjacency.get(node, []):
                if dst in seen:
                    continue
                seen.add(dst)
                came_from[dst] = node
                if dst == target_id:
                    path = [dst]
                    while path[-1] != start_id:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                nxt.append(dst)
        frontier = nxt
    return None


@transaction.atomic
def dependency_add(
    *, quantum_id: int, depends_on_id: int, kind: str = DependencyKind.BLOCKS
) -> Dependency:
    """`quantum_id` depends on `depends_on_id`. Refuses self-edges, duplicates and cycles."""
    if kind not in DependencyKind.values:
        raise InvalidQuantum(f"must be one of {', '.join(DependencyKind.values)}", field="kind")
    if quantum_id == depends_on_id:
        raise InvalidQuantum(f"a quantum cannot depend on itself (#{quantum_id})")
    found = set(
        Quantum.objects.filter(pk__in=[quantum_id, depends_on_id]).values_list("pk", flat=True)
    )
    for qid in (quantum_id, depends_on_id):
        if qid not in found:
            raise QuantumNotFound(f"no quantum #{qid}")
    if kind == DependencyKind.BLOCKS:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_BLOCKS_EDGE_LOCK])
        path = _cycle_path(start_id=depends_on_id, target_id=quantum_id)
        if path is not None:
            chain = " -> ".join(f"#{q}" for q in [quantum_id, *path])
            raise DependencyCycle(
                f"#{quantum_id} cannot depend on #{depends_on_id}: that closes the cycle {chain} "
                "(read 'A -> B' as 'A waits on B')"
            )
    try:
        with transaction.atomic():
            dependency = Dependency.objects.create(
                quantum_id=quantum_id, depends_on_id=depends_on_id, kind=kind
            )
    except IntegrityError:
        raise DuplicateDependency(
            f"#{quantum_id} already has a {kind} dependency on #{depends_on_id}"
        ) from None
    quanta_event(
        "dependency_added",
        {"quantum_id": quantum_id, "depends_on_id": depends_on_id, "kind": kind},
    )
    return dependency


@transaction.atomic
def dependency_remove(
    *, quantum_id: int, depends_on_id: int, kind: str = DependencyKind.BLOCKS
) -> None:
    deleted, _ = Dependency.objects.filter(
        quantum_id=quantum_id, depends_on_id=depends_on_id, kind=kind
    ).delete()
    if deleted == 0:
        raise DependencyNotFound(f"#{quantum_id} has no {kind} dependency on #{depends_on_id}")
    quanta_event(
        "dependency_removed",
        {"quantum_id": quantum_id, "depends_on_id": depends_on_id, "kind": kind},
    )


@transaction.atomic
def comment_add(
    *, quantum_id: int, body: str, author: str, author_kind: str = AuthorKind.OPERATOR
) -> Comment:
    if not body.strip():
        raise InvalidQuantum("must not be empty", field="comment")
    check_text("comment", body)
    check_text("author", author)
    if not author.strip() or len(author) > AUTHOR_MAX:
        raise InvalidQuantum(f"1 to {AUTHOR_MAX} characters", field="author")
    if author_kind not in AuthorKind.values:
        raise InvalidQuantum(f"must be one of {', '.join(AuthorKind.values)}", field="author_kind")
    _require_quantum(quantum_id)
    comment = Comment.objects.create(
        quantum_id=quantum_id, body=redact(body.strip()), author=author, author_kind=author_kind
    )
    search_refresh([quantum_id])
    quanta_event(
        "comment_added",
        {"quantum_id": quantum_id, "comment_id": comment.pk, "author": author},
    )
    return comment


# --- the burst manager's transitions (only the manager changes an in-progress quantum) -------


@transaction.atomic
def quanta_claim(*, quantum_ids: Sequence[int]) -> list[int]:
    """Claim open quanta for a run: open -> in_progress in one compare-and-set.

    Returns the ids actually claimed; a quantum another manager claimed first (or that changed
    status meanwhile) is simply not in the list, so no quantum can run twice.
    """
    if not quantum_ids:
        return []
    claimed = list(
        Quantum.objects.filter(pk__in=list(quantum_ids), status=S.OPEN)
        .select_for_update(skip_locked=True)
        .values_list("pk", flat=True)
    )
    if claimed:
        Quantum.objects.filter(pk__in=claimed, status=S.OPEN).update(
            status=S.IN_PROGRESS, updated_at=timezone.now()
        )
        status_changed(claimed, S.IN_PROGRESS)
    return claimed


@transaction.atomic
def quantum_release(*, quantum_id: int, to: str, reason: str) -> Quantum:
    """Give back an in-progress quantum: to `open` (its run failed or was cancelled) or to
    `blocked` (quarantined after repeated failures). The reason becomes a system comment."""
    if to not in {S.OPEN, S.BLOCKED}:
        raise InvalidQuantum(
            f"an in-progress quantum is released to open or blocked, not {to}", field="status"
        )
    quantum = _transition(
        quantum_id, allowed_from=frozenset({S.IN_PROGRESS}), to=to, verb=f"release to {to}"
    )
    if reason.strip():
        comment_add(
            quantum_id=quantum_id,
            body=reason,
            author="burst-manager",
            author_kind=AuthorKind.SYSTEM,
        )
    _quantum_event("quantum_released", quantum, reason=reason)
    return quantum


# --- bulk rows (the importer) -----------------------------------------------------------------

QUANTUM_COLUMNS = [
    "id",
    "title",
    "body",
    "kind",
    "status",
    "priority",
    "labels",
    "parent_id",
    "pipeline",
    "acceptance",
    "verify_commands",
    "complexity",
    "complexity_auto",
    "close_reason",
    "import_key",
    "created_at",
    "updated_at",
    "closed_at",
    "open_blockers",
]
DEPENDENCY_COLUMNS = ["quantum_id", "depends_on_id", "kind", "created_at"]
COMMENT_COLUMNS = ["quantum_id", "author_kind", "author", "body", "created_at"]


def _copy(table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """COPY rows in: several times faster than INSERT for bulk data, and still transactional."""
    with (
        connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row)


def quanta_ids_allocate(*, count: int) -> list[int]:
    """`count` new quantum ids, taken from the table's sequence."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Quantum._meta.db_table, count],
        )
        return [row[0] for row in cursor.fetchall()]


def quanta_rows_insert(
    *,
    quanta: Iterable[Sequence[Any]],
    dependencies: Iterable[Sequence[Any]],
    comments: Iterable[Sequence[Any]],
    analyze: bool,
    repository_id: int | None = None,
) -> None:
    """Insert checked rows in bulk (values in QUANTUM_COLUMNS, DEPENDENCY_COLUMNS and
    COMMENT_COLUMNS order; ids from `quanta_ids_allocate`), inside the caller's transaction.

    Edges and comments go in before their quanta (the foreign keys are deferred to commit): the
    open_blockers trigger then finds no quantum rows to bump, and each quantum row is written
    once, with the blocker count the caller computed and its search vector computed by the
    INSERT ... SELECT from a staging table, instead of written and then rewritten. `analyze`:
    refresh the planner's statistics after a big import, or the first queries plan blind.
    The quanta go to `repository_id` (None: the one the caller works on, repos.context).
    """
    repository = repository_id or current().repository_id or default_repository_id()
    quantum_table = Quantum._meta.db_table
    _copy(Dependency._meta.db_table, DEPENDENCY_COLUMNS, dependencies)
    _copy(Comment._meta.db_table, COMMENT_COLUMNS, comments)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMP TABLE import_quanta (LIKE {quantum_table} INCLUDING DEFAULTS)"
            " ON COMMIT DROP"
        )
        # The staging rows carry no repository: the INSERT below gives them theirs.
        cursor.execute("ALTER TABLE import_quanta ALTER COLUMN repository_id DROP NOT NULL")
    _copy("import_quanta", QUANTUM_COLUMNS, quanta)
    columns = ", ".join(QUANTUM_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quantum_table} ({columns}, repository_id, search_vector)"
            f" SELECT {columns}, %(repository)s, {_search_vector('s')} FROM import_quanta s",
            {"cfg": settings.SEARCH_CONFIG, "repository": repository},
        )
        cursor.execute("DROP TABLE import_quanta")
        if analyze:
            cursor.execute(f"ANALYZE {quantum_table}, {Dependency._meta.db_table}")
