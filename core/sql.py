"""Plain SQL for the writers: named statements with declared parameters, table and column names
taken from the models, and an INSERT compiled from a model as the ORM compiles one."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Generic, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models
from django.db.models import Field
from django.db.models.fields import AutoFieldMixin

P = TypeVar("P", bound=Mapping[str, Any])

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class Statement(Generic[P]):
    """One SQL statement, whole: its name, what it does in one line, its text, and its parameters
    as a TypedDict whose keys are exactly the text's `%(name)s` placeholders. The two are compared
    when the statement is defined (ImproperlyConfigured names the difference), so neither drifts
    from the other, and mypy checks the values each call passes."""

    def __init__(self, name: str, description: str, params: type[P], text: str) -> None:
        declared = set(getattr(params, "__required_keys__", ())) | set(
            getattr(params, "__optional_keys__", ())
        )
        used = set(_PLACEHOLDER.findall(text))
        if declared != used:
            raise ImproperlyConfigured(
                f"statement {name}: parameters declared but not used {sorted(declared - used)},"
                f" used but not declared {sorted(used - declared)}"
            )
        self.name, self.description, self.params, self.text = name, description, params, text

    def row(self, params: P) -> tuple[Any, ...]:
        """Run it and return its one row (a statement that selects exactly one)."""
        with connection.cursor() as cursor:
            cursor.execute(self.text, params)
            row = cursor.fetchone()
        if row is None:
            raise AssertionError(f"statement {self.name} returned no row")
        return tuple(row)

    def rows(self, params: P) -> list[tuple[Any, ...]]:
        """Run it and return its rows."""
        with connection.cursor() as cursor:
            cursor.execute(self.text, params)
            return [tuple(row) for row in cursor.fetchall()]

    def run(self, params: P) -> None:
        """Run it for its writes."""
        with connection.cursor() as cursor:
            cursor.execute(self.text, params)

    def __repr__(self) -> str:
        return f"<Statement {self.name}: {self.description}>"


def sql_names(model: type[models.Model], prefix: str = "") -> dict[str, str]:
    """`{prefix}table` and `{prefix}<attname>` -> the model's table and column names, for
    `str.format` on a statement (`{table}`, `{status}`, `{quantum_run_id}`)."""
    names = {f"{prefix}table": model._meta.db_table}
    names.update(
        {f"{prefix}{f.attname}": f.column for f in model._meta.concrete_fields if f.column}
    )
    return names


# rows_insert's own statement up to this many rows; bulk_create's beyond.
FEW = 32


@cache
def _insert_fields(model: type[models.Model]) -> tuple[list[Field[Any, Any]], str, str]:
    fields = [
        f
        for f in model._meta.concrete_fields
        if not isinstance(f, AutoFieldMixin) and not f.generated
    ]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    head = f'INSERT INTO "{model._meta.db_table}" ({columns}) VALUES '
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    return fields, head, row


def rows_insert(model: type[models.Model], objs: Sequence[models.Model]) -> None:
    """INSERT `objs` and set their primary keys, as `bulk_create` does for a model without
    parents. A few rows (a stage's agents) go in one precompiled statement, at a fraction of
    `bulk_create`'s Python cost (it compiles its statement anew on each call); more than FEW
    go through `bulk_create`, whose UNNEST of one array per column is cheaper for thousands.
    Every concrete field but an auto primary key and a generated column is written, after its
    `pre_save` (auto_now_add stamps it) and `get_db_prep_save`: a field's Python default
    applies, not its `db_default`."""
    if not objs:
        return
    if len(objs) > FEW:
        model._default_manager.bulk_create(objs)
        return
    fields, head, row = _insert_fields(model)
    pk = model._meta.pk
    assert pk is not None
    with connection.cursor() as cursor:
        cursor.execute(
            f'{head}{", ".join([row] * len(objs))} RETURNING "{pk.column}"',
            [value for obj in objs for value in _row_values(obj, fields)],
        )
        ids = [pk_value for (pk_value,) in cursor.fetchall()]
    rows_inserted(objs, ids)


def _row_values(obj: models.Model, fields: list[Field[Any, Any]]) -> list[Any]:
    """What an INSERT writes of `obj`: each field after its `pre_save`, prepared for the
    database."""
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


def rows_insert_cte(
    model: type[models.Model], objs: Sequence[models.Model], *, name: str
) -> tuple[str, dict[str, Any]]:
    """`rows_insert` as the CTE `name` of a caller's statement, and its named parameters
    (`name_0`, `name_1`, ...): the caller selects `rows_ids(model, name)` and hands the ids to
    `rows_inserted`. For a few rows (`objs` must not be empty)."""
    fields, head, _ = _insert_fields(model)
    pk = model._meta.pk
    assert pk is not None and objs
    params: dict[str, Any] = {}
    rows = []
    for obj in objs:
        keys = []
        for value in _row_values(obj, fields):
            key = f"{name}_{len(params)}"
            params[key] = value
            keys.append(f"%({key})s")
        rows.append("(" + ", ".join(keys) + ")")
    return f'{name} AS (\n{head}{", ".join(rows)}\nRETURNING "{pk.column}"\n)', params


def rows_ids(model: type[models.Model], name: str) -> str:
    """The ids the CTE `name` of `rows_insert_cte` inserted, in the rows' order: a serial
    primary key takes its values in the order the rows are inserted."""
    pk = model._meta.pk
    assert pk is not None
    return f'ARRAY(SELECT "{pk.column}" FROM {name} ORDER BY "{pk.column}")'


def rows_inserted(objs: Sequence[models.Model], ids: Sequence[Any]) -> None:
    """Set the primary keys an INSERT returned on its objects, and mark them saved."""
    for obj, pk_value in zip(objs, ids, strict=True):
        obj.pk = pk_value
        obj._state.adding = False
        obj._state.db = connection.alias
