"""Reads over quanta: the ready query that drives the system, explanations, listings (full-text
search is `quanta.search`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import connection
from django.db.models import F, Q, QuerySet

from quanta.errors import QuantumNotFound
from quanta.models import Comment, Dependency, Quantum, QuantumStatus
from quanta.search import search_to_tsquery

S = QuantumStatus


def quanta_ready(
    *,
    repository_id: int | None = None,
    labels: Sequence[str] = (),
    exclude_ids: Sequence[int] = (),
    limit: int | None = None,
) -> QuerySet[Quantum]:
    """Open quanta whose every `blocks` dependency is closed, by priority then age.

    `repository_id` scopes to one repository's quanta (None: every repository's); `labels` to
    quanta carrying any of them. A walk of the partial index quantum_ready_repository (one
    repository) or quantum_ready_order (all): `open_blockers` is kept by triggers (quanta
    migration 0003).
    """
    qs = Quantum.objects.filter(status=S.OPEN, open_blockers=0).order_by(
        "priority", "created_at", "id"
    )
    if repository_id is not None:
        qs = qs.filter(repository_id=repository_id)
    if labels:
        qs = qs.filter(labels__overlap=list(labels))
    if exclude_ids:
        qs = qs.exclude(pk__in=list(exclude_ids))
    return qs[:limit] if limit is not None else qs


def quanta_blocked(*, limit: int | None = None) -> QuerySet[Quantum]:
    """Quanta that cannot start: open with an unfinished blocker, or quarantined (`blocked`)."""
    qs = Quantum.objects.filter(
        Q(status=S.BLOCKED) | Q(status=S.OPEN, open_blockers__gt=0)
    ).order_by("priority", "created_at", "id")
    return qs[:limit] if limit is not None else qs


@dataclass
class Blocker:
    id: int
    title: str
    status: str
    waits_on: list[int] = field(default_factory=list)  # its own unfinished blockers


@dataclass
class WhyNotReady:
    quantum_id: int
    title: str
    status: str
    ready: bool
    reasons: list[str]  # status reasons, in words
    direct: list[int]  # unfinished direct blockers
    blockers: dict[int, Blocker]  # every unfinished blocker, transitively

    def describe(self) -> str:
        """A paragraph for humans, with the blocker tree indented under the quantum."""
        head = f"#{self.quantum_id} {self.title!r}"
        if self.ready:
            return f"{head} is ready."
        lines = [f"{head} is not ready:"]
        lines += [f"  - {reason}" for reason in self.reasons]
        if self.direct:
            roots = [b for b in self.blockers.values() if not b.waits_on]
            lines.append(
                f"  - it waits on {_count(len(self.direct), 'quantum')} "
                f"({_count(len(self.blockers), 'unfinished blocker')} in all; "
                f"start with {', '.join(f'#{b.id}' for b in roots[:10])}):"
            )
            shown: set[int] = set()

            def walk(qid: int, depth: int) -> None:
                blocker = self.blockers[qid]
                suffix = " (see above)" if qid in shown and blocker.waits_on else ""
                lines.append(f"{'    ' * depth}#{qid} {blocker.title!r} [{blocker.status}]{suffix}")
                if qid in shown or depth > 20:
                    return
                shown.add(qid)
                for child in blocker.waits_on:
                    walk(child, depth + 1)

            for qid in self.direct:
                walk(qid, 1)
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    plural = "quanta" if noun == "quantum" else f"{noun}s"
    return f"{n} {noun if n == 1 else plural}"


_STATUS_REASONS: dict[str, str] = {
    S.IN_PROGRESS: "it is in progress (a run holds it)",
    S.CLOSED: "it is closed",
    S.DEFERRED: "it is deferred (reopen it to make it eligible)",
    S.BLOCKED: "it is blocked: quarantined after repeated failures, waiting on the Tether",
}


def quantum_why_not_ready(*, quantum_id: int) -> WhyNotReady:
    """Why a quantum is not in the ready set: its status and every unfinished blocker, transitively.

    The walk is a set-semantics recursive CTE (UNION of edges), linear in the edges reached.
    """
    quantum = Quantum.objects.filter(pk=quantum_id).values("title", "status").first()
    if quantum is None:
        raise QuantumNotFound(f"no quantum #{quantum_id}")
    dependencies, quanta = Dependency._meta.db_table, Quantum._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE chain(src, dst) AS (
                SELECT d.quantum_id, d.depends_on_id
                  FROM {dependencies} d JOIN {quanta} b ON b.id = d.depends_on_id
                 WHERE d.quantum_id = %(id)s AND d.kind = 'blocks' AND b.status <> 'closed'
                UNION
                SELECT d.quantum_id, d.depends_on_id
                  FROM chain c
                  JOIN {dependencies} d ON d.quantum_id = c.dst AND d.kind = 'blocks'
                  JOIN {quanta} b ON b.id = d.depends_on_id
                 WHERE b.status <> 'closed'
            )
            SELECT c.src, c.dst, b.title, b.status
              FROM chain c JOIN {quanta} b ON b.id = c.dst
             ORDER BY b.priority, b.created_at, b.id
            """,
            {"id": quantum_id},
        )
        rows = cursor.fetchall()
    blockers: dict[int, Blocker] = {}
    direct: list[int] = []
    for _src, dst, title, status in rows:
        blockers.setdefault(dst, Blocker(id=dst, title=title, status=status))
    for src, dst, _title, _status in rows:
        if src == quantum_id:
            direct.append(dst)
        elif src in blockers:
            blockers[src].waits_on.append(dst)
    reasons = [_STATUS_REASONS[quantum["status"]]] if quantum["status"] in _STATUS_REASONS else []
    return WhyNotReady(
        quantum_id=quantum_id,
        title=quantum["title"],
        status=quantum["status"],
        ready=not reasons and not direct,
        reasons=reasons,
        direct=direct,
        blockers=blockers,
    )


def quantum_get(*, quantum_id: int) -> Quantum:
    try:
        return Quantum.objects.select_related("parent").get(pk=quantum_id)
    except Quantum.DoesNotExist:
        raise QuantumNotFound(f"no quantum #{quantum_id}") from None


def quanta_list(
    *,
    status: str | None = None,
    label: str | None = None,
    priority: int | None = None,
    parent_id: int | None = None,
) -> QuerySet[Quantum]:
    qs = Quantum.objects.order_by("priority", "created_at", "id")
    if status is not None:
        qs = qs.filter(status=status)
    if label is not None:
        qs = qs.filter(labels__contains=[label])
    if priority is not None:
        qs = qs.filter(priority=priority)
    if parent_id is not None:
        qs = qs.filter(parent_id=parent_id)
    return qs


def quanta_children(*, parent_id: int) -> QuerySet[Quantum]:
    """The children of an epic (or any parent), in priority order."""
    if not Quantum.objects.filter(pk=parent_id).exists():
        raise QuantumNotFound(f"no quantum #{parent_id}")
    return quanta_list(parent_id=parent_id)


# --- the control room ---------------------------------------------------------------------------


@dataclass
class Neighbour:
    id: int
    title: str
    status: str


@dataclass
class Neighbourhood:
    """A quantum's direct dependency edges: what it waits on and what waits on it, by kind."""

    quantum: Neighbour
    upstream: list[tuple[Neighbour, str]]  # (quantum it depends on, edge kind)
    downstream: list[tuple[Neighbour, str]]  # (quantum depending on it, edge kind)


def quantum_neighbourhood(*, quantum_id: int, limit: int = 25) -> Neighbourhood:
    """One hop of the dependency graph around a quantum (two queries, capped per side)."""

    quantum = quantum_get(quantum_id=quantum_id)
    up = (
        Dependency.objects.filter(quantum_id=quantum_id)
        .select_related("depends_on")
        .order_by("depends_on__priority", "depends_on_id")[:limit]
    )
    down = (
        Dependency.objects.filter(depends_on_id=quantum_id)
        .select_related("quantum")
        .order_by("quantum__priority", "quantum_id")[:limit]
    )
    return Neighbourhood(
        quantum=Neighbour(quantum.pk, quantum.title, quantum.status),
        upstream=[
            (Neighbour(d.depends_on.pk, d.depends_on.title, d.depends_on.status), d.kind)
            for d in up
        ],
        downstream=[
            (Neighbour(d.quantum.pk, d.quantum.title, d.quantum.status), d.kind) for d in down
        ],
    )


def quanta_browse(
    *,
    query: str = "",
    status: str | None = None,
    label: str | None = None,
    priority: int | None = None,
    kind: str | None = None,
    repository_id: int | None = None,
) -> QuerySet[Quantum]:
    """The list page: filters (`repository_id`: one repository's quanta; None: all), and
    full-text search ranked best first when `query` is given."""
    qs = quanta_list(status=status, label=label, priority=priority)
    if kind is not None:
        qs = qs.filter(kind=kind)
    if repository_id is not None:
        qs = qs.filter(repository_id=repository_id)
    if query.strip():
        tsquery = SearchQuery(
            search_to_tsquery(query), search_type="raw", config=settings.SEARCH_CONFIG
        )
        qs = (
            qs.filter(search_vector=tsquery)
            .annotate(rank=SearchRank(F("search_vector"), tsquery))
            .order_by("-rank", "priority", "id")
        )
    return qs.defer("search_vector")


def quantum_comments(*, quantum_id: int) -> QuerySet[Comment]:
    return Comment.objects.filter(quantum_id=quantum_id).order_by("created_at", "id")
