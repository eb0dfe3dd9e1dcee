"""Cursor pagination: a page of a listing in a stable order and an opaque cursor to the next.

The cursor is signed (django.core.signing) and names its listing and filters, so one handed
out for another listing, or altered, is refused rather than silently paging something else.
Keyset listings carry the sort key of the last row (an index range scan, however deep the
page); ranked search results carry an offset (a rank has no exact keyset)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.core import signing
from django.db import models
from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL

from api.errors import BadCursor

M = TypeVar("M", bound=models.Model)
T = TypeVar("T")

SALT = "api.cursor"


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def listing_id(name: str, filters: dict[str, Any]) -> str:
    """The listing a cursor belongs to: its name and a digest of its filters."""
    digest = hashlib.sha256(json.dumps(filters, sort_keys=True, default=str).encode()).hexdigest()
    return f"{name}:{digest[:16]}"


def _encode(listing: str, payload: dict[str, Any]) -> str:
    return signing.dumps({"l": listing, **payload}, salt=SALT, compress=True)


def _decode(cursor: str, listing: str) -> dict[str, Any]:
    try:
        data = signing.loads(cursor, salt=SALT)
    except signing.BadSignature:
        raise BadCursor("the cursor is not one this API handed out") from None
    if not isinstance(data, dict) or data.get("l") != listing:
        raise BadCursor("the cursor belongs to another listing or other filters")
    return data


def _value(obj: models.Model, name: str) -> Any:
    value = getattr(obj, "pk" if name == "id" else name)
    return value.isoformat() if isinstance(value, datetime) else value


def _typed(qs: QuerySet[M], name: str, raw: Any) -> Any:
    field = qs.model._meta.get_field(name)
    if isinstance(field, models.DateTimeField):
        if not isinstance(raw, str):
            raise BadCursor("the cursor is damaged")
        return datetime.fromisoformat(raw)
    return raw


def _after(
    qs: QuerySet[M], order: Sequence[str], names: list[str], values: list[Any]
) -> Q | RawSQL:
    """Rows after the cursor's key. All in one direction: a row comparison, which Postgres
    serves as one range of the btree index in that order (an OR of the column-by-column
    conditions is not an index range: it filters the whole walk from the start)."""
    descending = {o.startswith("-") for o in order}
    if len(descending) == 1:
        meta = qs.model._meta
        fields = [meta.get_field(n) for n in names]
        columns = ", ".join(
            f'"{meta.db_table}"."{f.column}"' for f in fields if isinstance(f, models.Field)
        )
        op = "<" if descending.pop() else ">"
        marks = ", ".join(["%s"] * len(values))
        return RawSQL(f"({columns}) {op} ({marks})", values, output_field=BooleanField())
    after = Q()
    for i, (o, name) in enumerate(zip(order, names, strict=True)):
        op = "lt" if o.startswith("-") else "gt"
        equal = {names[j]: values[j] for j in range(i)}
        after |= Q(**equal, **{f"{name}__{op}": values[i]})
    return after


def keyset_page(
    qs: QuerySet[M],
    *,
    listing: str,
    order: Sequence[str],
    cursor: str | None,
    limit: int,
    fetch: Callable[[QuerySet[M], int], list[M]] | None = None,
) -> Page[M]:
    """A page of `qs` in `order` (field names, "-" for descending, the last one unique).
    `fetch(qs, n)` reads the first `n` rows of the ordered query after the cursor (a slice
    unless given: a search reads them its own way)."""
    qs = qs.order_by(*order)
    names = [o.lstrip("-") for o in order]
    if cursor:
        keys = _decode(cursor, listing).get("k")
        if not isinstance(keys, list) or len(keys) != len(names):
            raise BadCursor("the cursor is damaged")
        values = [_typed(qs, name, raw) for name, raw in zip(names, keys, strict=True)]
        qs = qs.filter(_after(qs, order, names, values))
    rows = fetch(qs, limit + 1) if fetch is not None else list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = (
        _encode(listing, {"k": [_value(rows[-1], n) for n in names]}) if more and rows else None
    )
    return Page(rows, next_cursor)


def offset_of(cursor: str | None, *, listing: str) -> int:
    """Where a ranked listing resumes (0 without a cursor)."""
    if not cursor:
        return 0
    offset = _decode(cursor, listing).get("o")
    if not isinstance(offset, int) or offset < 0:
        raise BadCursor("the cursor is damaged")
    return offset


def offset_cursor(*, listing: str, offset: int) -> str:
    return _encode(listing, {"o": offset})
