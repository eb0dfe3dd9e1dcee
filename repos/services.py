"""Writes of the repository registry. Checking that a location is a git repository and has the
target branch needs git, which lives above this app: callers pass that check in (`inspect`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.locations import location_parse as core_location_parse
from core.safeyaml import InputRefused, yaml_load
from repos.context import DEFAULT_NAME
from repos.errors import InvalidRepository, RepositoryInUse, RepositoryNotFound
from repos.models import NAME_PATTERN, Repository

# inspect(location, target_branch): raises InvalidRepository when the location is not a git
# repository or has no such branch.
Inspector = Callable[[str, str], None]

ENVIRONMENT_MAX_CHARS = 100_000
_BRANCH = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)[A-Za-z0-9._/+-]{1,255}(?<![./])$")

# Statuses that still hold work: a repository with any of them cannot be removed.
_QUANTUM_DONE = ("closed",)
_WAVE_OPEN = ("running",)
_GOAL_DONE = ("done", "failed", "abandoned")


def location_parse(raw: str) -> str:
    """A location as ANNIHILATION_REPO accepts it: a URL (`scheme://...` or scp-like
    `user@host:path`) as written, or a local path made absolute."""
    raw = raw.strip()
    if not raw:
        raise InvalidRepository("a location is required: a local path or a repository URL")
    try:
        return str(core_location_parse(raw, what=f"location {raw!r}"))
    except ValueError as exc:
        raise InvalidRepository(str(exc)) from None


def environment_check(text: str) -> str:
    """The operator's environment declaration as given, when it is a YAML or JSON mapping
    (JSON is YAML); "" stays "" (none)."""
    if not text.strip():
        return ""
    if len(text) > ENVIRONMENT_MAX_CHARS:
        raise InvalidRepository(
            f"the environment declaration is {len(text)} characters; "
            f"at most {ENVIRONMENT_MAX_CHARS}"
        )
    try:
        data: Any = yaml_load(text)
    except InputRefused as exc:
        raise InvalidRepository(f"the environment declaration: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRepository(
            "the environment declaration must be a mapping (keys and values), "
            f"not {type(data).__name__}"
        )
    return text


def _name_check(name: str) -> str:
    name = name.strip()
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidRepository(
            f"name {name!r}: 1 to 63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _branch_check(branch: str) -> str:
    branch = branch.strip()
    if branch and not _BRANCH.fullmatch(branch):
        raise InvalidRepository(f"branch {branch!r} is not a valid branch name")
    return branch


def _commands_check(commands: Sequence[str]) -> list[str]:
    if isinstance(commands, str):
        raise InvalidRepository("verify commands are a list of commands, not one string")
    cleaned = [c.strip() for c in commands if c.strip()]
    if any("\0" in c for c in cleaned):
        raise InvalidRepository("a verify command holds a NUL byte")
    return cleaned


def repository_default() -> Repository:
    """The default repository (ANNIHILATION_REPO), made on first use; its stored location
    follows the setting."""
    location = str(settings.ANNIHILATION_REPO)
    found = Repository.objects.filter(is_default=True).first()
    if found is None:
        try:
            with transaction.atomic():
                name = DEFAULT_NAME
                if Repository.objects.filter(name=name, removed_at__isnull=True).exists():
                    name = f"{DEFAULT_NAME}-{timezone.now():%Y%m%d%H%M%S}"
                return Repository.objects.create(name=name, location=location, is_default=True)
        except IntegrityError:  # made by a concurrent first use
            found = Repository.objects.get(is_default=True)
    if found.location != location:
        Repository.objects.filter(pk=found.pk).update(location=location)
        found.location = location
    return found


def default_repository_id() -> int:
    """The default of every `repository` foreign key: rows made without one belong to the
    default repository."""
    return repository_default().pk


@transaction.atomic
def repository_create(
    *,
    name: str,
    location: str,
    inspect: Inspector,
    target_branch: str = "",
    verify_commands: Sequence[str] = (),
    environment: str = "",
) -> Repository:
    """Register a repository. InvalidRepository for bad fields, a location that is not a git
    repository or lacks the branch, or a name already registered."""
    name = _name_check(name)
    location = location_parse(location)
    target_branch = _branch_check(target_branch)
    commands = _commands_check(verify_commands)
    environment = environment_check(environment)
    if Repository.objects.filter(name=name, removed_at__isnull=True).exists():
        raise InvalidRepository(f"a repository named {name!r} is already registered")
    inspect(location, target_branch)
    try:
        with transaction.atomic():
            return Repository.objects.create(
                name=name,
                location=location,
                target_branch=target_branch,
                verify_commands=commands,
                environment=environment,
            )
    except IntegrityError as exc:
        raise InvalidRepository(f"a repository named {name!r} is already registered") from exc


@transaction.atomic
def repository_update(
    *,
    name: str,
    inspect: Inspector,
    target_branch: str | None = None,
    verify_commands: Sequence[str] | None = None,
    environment: str | None = None,
) -> Repository:
    """Change a repository's target branch, verify commands or environment declaration (None:
    unchanged)."""
    repository = (
        Repository.objects.select_for_update().filter(name=name, removed_at__isnull=True).first()
    )
    if repository is None:
        raise RepositoryNotFound(f"no repository named {name!r}")
    if target_branch is not None:
        repository.target_branch = _branch_check(target_branch)
        location = str(settings.ANNIHILATION_REPO) if repository.is_default else repository.location
        inspect(location, repository.target_branch)
    if verify_commands is not None:
        repository.verify_commands = _commands_check(verify_commands)
    if environment is not None:
        repository.environment = environment_check(environment)
    repository.save()
    return repository


@transaction.atomic
def repository_remove(*, name: str) -> Repository:
    """Remove a repository from the registry: refused for the default one and while it has open
    quanta, running waves or unfinished goals. Its history stays (closed quanta, reviews)."""
    repository = (
        Repository.objects.select_for_update().filter(name=name, removed_at__isnull=True).first()
    )
    if repository is None:
        raise RepositoryNotFound(f"no repository named {name!r}")
    if repository.is_default:
        raise RepositoryInUse(
            f"{name!r} is the default repository (ANNIHILATION_REPO); it cannot be removed"
        )
    held = {
        "open quanta": repository.quanta.exclude(status__in=_QUANTUM_DONE).count(),
        "running waves": repository.waves.filter(status__in=_WAVE_OPEN).count(),
        "unfinished goals": repository.goals.exclude(status__in=_GOAL_DONE).count(),
    }
    if any(held.values()):
        what = ", ".join(f"{n} {label}" for label, n in held.items() if n)
        raise RepositoryInUse(f"repository {name!r} has {what}: close them first; nothing removed")
    Repository.objects.filter(pk=repository.pk).update(removed_at=timezone.now())
    repository.refresh_from_db()
    return repository


def repository_as_data(repository: Repository) -> dict[str, Any]:
    """A repository as plain data (CLI JSON, API)."""
    return {
        "id": repository.pk,
        "name": repository.name,
        "location": (
            str(settings.ANNIHILATION_REPO) if repository.is_default else repository.location
        ),
        "target_branch": repository.target_branch,
        "verify_commands": list(repository.verify_commands),
        "environment": repository.environment,
        "is_default": repository.is_default,
        "created_at": repository.created_at.isoformat(),
    }
