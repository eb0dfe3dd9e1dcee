"""Helpers for the migrations that give existing rows a repository."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from repos.context import DEFAULT_NAME


def default_repository_pk(apps: Any) -> int:
    """The default repository's id, the row made (from ANNIHILATION_REPO) when there is none:
    with the historical model, as a migration must."""
    repository = apps.get_model("repos", "Repository")
    found = repository.objects.filter(is_default=True).first()
    if found is None:
        found = repository.objects.create(
            name=DEFAULT_NAME, location=str(settings.ANNIHILATION_REPO), is_default=True
        )
    return int(found.pk)


def rows_to_default(app_label: str, model_name: str) -> Any:
    """A RunPython function: every row of the model without a repository gets the default."""

    def forward(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
        model = apps.get_model(app_label, model_name)
        if not model.objects.filter(repository__isnull=True).exists():
            return
        model.objects.filter(repository__isnull=True).update(
            repository_id=default_repository_pk(apps)
        )

    return forward
