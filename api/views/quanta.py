"""Quanta: list with filters, full-text search, show, create, update, close, import."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from django.db.models import QuerySet
from django.http import HttpRequest, JsonResponse
from ninja import Field, Query, Router, Schema

from api.auth import operate_auth, read_auth
from api.pagination import keyset_page, listing_id, offset_cursor, offset_of
from api.schemas import (
    ImportIn,
    ImportOut,
    ProblemOut,
    QuantumCreateIn,
    QuantumOut,
    QuantumPage,
    QuantumUpdateIn,
    ReasonIn,
    SearchPage,
)
from api.views.common import atomic_call, created, dump, page_size
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.search import quanta_search_in_order
from quanta.selectors import quanta_browse, quantum_get
from quanta.services import QuantumChanges, quantum_close, quantum_create, quantum_update
from repos.selectors import repository_get

router = Router(tags=["quanta"])

ERRORS: dict[int | tuple[int, ...], Any] = {(400, 401, 403, 404, 409, 422, 429): ProblemOut}
ORDER = ("priority", "created_at", "id")  # quanta_list's order; the index quantum_status_priority


class QuantaFilters(Schema):
    status: str | None = None
    label: str | None = None
    priority: int | None = None
    kind: str | None = None
    repository: str | None = Field(None, description="a repository's name: its quanta only")
    cursor: str | None = None
    limit: int | None = None


def _scope(filters: QuantaFilters) -> dict[str, Any]:
    """The filters a cursor is bound to (a repository only when one is named)."""
    scope = filters.model_dump(exclude={"cursor", "limit", "repository"})
    return {**scope, "repository": filters.repository} if filters.repository else scope


class SearchFilters(QuantaFilters):
    q: str = Field(description='words, "phrases", OR, -exclusion, prefix*')
    order: Literal["priority", "rank"] = Field(
        "priority",
        description="priority: the list's order, keyset pages (fast however broad the query);"
        " rank: best match first (every match is ranked: slower for broad queries)",
    )


@router.get("/quanta", response={200: QuantumPage, **ERRORS}, auth=read_auth)
def quanta_list_view(request: HttpRequest, filters: Query[QuantaFilters]) -> dict[str, Any]:
    """Quanta by priority, then age; filters combine (AND)."""
    page = keyset_page(
        _browse(filters),
        listing=listing_id("quanta", _scope(filters)),
        order=ORDER,
        cursor=filters.cursor,
        limit=page_size(filters.limit),
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


def _browse(filters: QuantaFilters, query: str = "") -> QuerySet[Quantum]:
    return quanta_browse(
        query=query,
        status=filters.status,
        label=filters.label,
        priority=filters.priority,
        kind=filters.kind,
        # RepositoryNotFound (a 404) for a name no live repository has.
        repository_id=repository_get(name=filters.repository).pk if filters.repository else None,
    )


@router.get("/quanta/search", response={200: SearchPage, **ERRORS}, auth=read_auth)
def quanta_search_view(request: HttpRequest, filters: Query[SearchFilters]) -> dict[str, Any]:
    """Full-text search over title, body and comments, with the same filters as the list. Each
    hit carries its rank; `order=rank` sorts by it, best match first."""
    limit = page_size(filters.limit)
    listing = listing_id("quanta-search", _scope(filters))
    if filters.order == "priority":
        # The listing walked from the cursor; quanta_search_in_order reads its rows against
        # the query and ranks only the rows returned.
        page = keyset_page(
            _browse(filters),
            listing=listing,
            order=ORDER,
            cursor=filters.cursor,
            limit=limit,
            fetch=lambda qs, n: quanta_search_in_order(quanta=qs, query=filters.q, count=n),
        )
        rows, next_cursor = page.items, page.next_cursor
    else:
        offset = offset_of(filters.cursor, listing=listing)
        matches = _browse(filters, query=filters.q)
        rows = list(matches[offset : offset + limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = offset_cursor(listing=listing, offset=offset + limit) if more else None
    return {
        "items": [{"quantum": q, "rank": float(q.rank)} for q in rows],  # type: ignore[attr-defined]
        "next_cursor": next_cursor,
    }


@router.get("/quanta/{int:quantum_id}", response={200: QuantumOut, **ERRORS}, auth=read_auth)
def quantum_show(request: HttpRequest, quantum_id: int) -> Quantum:
    return quantum_get(quantum_id=quantum_id)


@router.post("/quanta", response={201: QuantumOut, **ERRORS}, auth=operate_auth)
def quantum_create_view(request: HttpRequest, payload: QuantumCreateIn) -> JsonResponse:
    """A new quantum. Send an `Idempotency-Key` to make retries safe."""
    return created(
        request,
        operation="quanta.create",
        payload=payload,
        run=lambda: quantum_create(**payload.model_dump()),
        out=lambda q: dump(QuantumOut, q),
    )


@router.patch("/quanta/{int:quantum_id}", response={200: QuantumOut, **ERRORS}, auth=operate_auth)
def quantum_update_view(request: HttpRequest, quantum_id: int, payload: QuantumUpdateIn) -> Quantum:
    """Change fields (not the status). `complexity: "auto"` hands it back to the classifier."""
    fields = payload.model_dump(exclude_unset=True, exclude={"parent_id", "clear_parent"})
    changes: QuantumChanges = {k: v for k, v in fields.items() if v is not None}  # type: ignore[assignment]
    if fields.get("complexity") == "auto":
        changes["complexity"] = None
    return atomic_call(
        quantum_update,
        quantum_id=quantum_id,
        changes=changes,
        parent_id=payload.parent_id,
        clear_parent=payload.clear_parent,
    )


@router.post(
    "/quanta/{int:quantum_id}/close", response={200: QuantumOut, **ERRORS}, auth=operate_auth
)
def quantum_close_view(request: HttpRequest, quantum_id: int, payload: ReasonIn) -> Quantum:
    """Close an open, blocked or deferred quantum, saying why."""
    return atomic_call(quantum_close, quantum_id=quantum_id, reason=payload.reason)


def _import(payload: ImportIn) -> list[int]:
    # The importer reads a file (and names it in its problems): a folder of our own, the file
    # named as the client would know it.
    with tempfile.TemporaryDirectory(prefix="api-import-") as folder:
        path = Path(folder) / f"import.{payload.format}"
        path.write_text(payload.text, encoding="utf-8")
        return quanta_import(path=path)


@router.post("/quanta/import", response={201: ImportOut, **ERRORS}, auth=operate_auth)
def quanta_import_view(request: HttpRequest, payload: ImportIn) -> JsonResponse:
    """Import YAML or JSON lines (the format of `manage.py quanta import`): every record, or
    nothing and a 422 listing every problem."""
    return created(
        request,
        operation="quanta.import",
        payload=payload,
        run=lambda: _import(payload),
        out=lambda ids: {"ids": ids},
    )
