"""Reads of the repository registry."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from repos.errors import RepositoryNotFound
from repos.models import Repository


def repositories_list() -> QuerySet[Repository]:
    """Registered repositories (not removed), by name, with their open quanta counted."""
    return (
        Repository.objects.filter(removed_at__isnull=True)
        .annotate(open_quanta=Count("quanta", filter=~Q(quanta__status="closed")))
        .order_by("-is_default", "name")
    )


def repository_get(*, name: str) -> Repository:
    """A registered repository by name, or by id given as digits."""
    found = Repository.objects.filter(removed_at__isnull=True)
    repository = (found.filter(pk=int(name)) if name.isdigit() else found.filter(name=name)).first()
    if repository is None:
        raise RepositoryNotFound(f"no repository named {name!r}")
    return repository
