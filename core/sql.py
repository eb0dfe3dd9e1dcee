"""Table and column names for the writers' plain SQL statements, taken from the models."""

from __future__ import annotations

from django.db import models


def sql_names(model: type[models.Model], prefix: str = "") -> dict[str, str]:
    """`{prefix}table` and `{prefix}<attname>` -> the model's table and column names, for
    `str.format` on a statement (`{table}`, `{status}`, `{quantum_run_id}`)."""
    names = {f"{prefix}table": model._meta.db_table}
    names.update(
        {f"{prefix}{f.attname}": f.column for f in model._meta.concrete_fields if f.column}
    )
    return names
