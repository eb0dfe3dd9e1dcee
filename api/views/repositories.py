"""Repositories: the registry of repositories agents work on."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router

from api.auth import operate_auth, read_auth
from api.schemas import ProblemOut, RepositoryCreateIn, RepositoryOut, RepositoryUpdateIn
from api.views.common import atomic_call, created, dump
from psychonauts.workspaces.registration import repository_inspect
from repos.models import Repository
from repos.selectors import repositories_list, repository_get
from repos.services import (
    repository_create,
    repository_default,
    repository_remove,
    repository_update,
)

router = Router()

ERRORS: dict[int | tuple[int, ...], Any] = {(400, 401, 403, 404, 409, 422, 429): ProblemOut}
TAGS = ["repositories"]


@router.get(
    "/repositories", response={200: list[RepositoryOut], **ERRORS}, auth=read_auth, tags=TAGS
)
def repositories_list_view(request: HttpRequest) -> list[Repository]:
    """Registered repositories, the default one (ANNIHILATION_REPO) first."""
    repository_default()
    return list(repositories_list())


@router.get(
    "/repositories/{name}", response={200: RepositoryOut, **ERRORS}, auth=read_auth, tags=TAGS
)
def repository_show(request: HttpRequest, name: str) -> Repository:
    """One repository, by name (or id)."""
    return repository_get(name=name)


@router.post("/repositories", response={201: RepositoryOut, **ERRORS}, auth=operate_auth, tags=TAGS)
def repository_create_view(request: HttpRequest, payload: RepositoryCreateIn) -> JsonResponse:
    """Register a repository: its location must be a git repository with the target branch; a
    duplicate name, a bad environment declaration or branch is a 422 and registers nothing."""
    return created(
        request,
        operation="repositories.create",
        payload=payload,
        run=lambda: repository_create(**payload.model_dump(), inspect=repository_inspect),
        out=lambda r: dump(RepositoryOut, r),
    )


@router.patch(
    "/repositories/{name}", response={200: RepositoryOut, **ERRORS}, auth=operate_auth, tags=TAGS
)
def repository_update_view(
    request: HttpRequest, name: str, payload: RepositoryUpdateIn
) -> Repository:
    """Change the target branch, verify commands or environment declaration (absent: kept)."""
    return atomic_call(
        repository_update, name=name, inspect=repository_inspect, **payload.model_dump()
    )


@router.delete(
    "/repositories/{name}", response={200: RepositoryOut, **ERRORS}, auth=operate_auth, tags=TAGS
)
def repository_remove_view(request: HttpRequest, name: str) -> Repository:
    """Remove a repository: a 409 while it has open quanta, running waves or unfinished goals,
    or for the default one. Its history stays."""
    return atomic_call(repository_remove, name=name)
