"""Which repository the code at hand works on.

Git, worktrees, the merge queue and verification ask `current()` for the repository's location,
clone, target branch and verify commands. An entry point that works for one repository (an agent
run, a review, the merge queue, a scan) enters `working_on(...)` for it; code outside
any such block works on the default repository, whose fields follow the settings
(ANNIHILATION_REPO, ANNIHILATION_CLONE, ANNIHILATION_TETHER_TARGET_BRANCH,
ANNIHILATION_TETHER_VERIFY_COMMANDS) without a database query.

The choice is a context variable: each thread and each asyncio task has its own. A thread pool
started inside a block does not inherit it; submit through `contextvars.copy_context().run`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from repos.errors import RepositoryNotFound
from repos.models import Repository


@dataclass(frozen=True)
class Target:
    """What the runtime needs of one repository, read once per block."""

    repository_id: int | None  # None: the default repository, from the settings alone
    name: str
    location: str  # an absolute path, or a central repository's URL
    clone: Path  # this host's clone when `location` is a URL
    target_branch: str  # "" = the branch the repository has checked out
    verify_commands: tuple[str, ...]
    environment: str = ""  # the operator's environment declaration (YAML text); "" = none

    @property
    def url(self) -> str:
        """The central repository's URL, or "" for a local path."""
        return "" if self.location.startswith("/") else self.location


DEFAULT_NAME = "default"

_current: ContextVar[Target | None] = ContextVar("annihilation_repository", default=None)


def default_target() -> Target:
    return Target(
        repository_id=None,
        name=DEFAULT_NAME,
        location=str(settings.ANNIHILATION_REPO),
        clone=Path(
            getattr(settings, "ANNIHILATION_CLONE", "")
            or Path(settings.ANNIHILATION_HOME) / "clone"
        ),
        target_branch=str(settings.TETHER_TARGET_BRANCH),
        verify_commands=tuple(settings.TETHER_VERIFY_COMMANDS),
    )


def target_of(repository: Repository) -> Target:
    """The default repository's location, clone, branch and checks are the settings' (its own
    branch and commands, when set, win); any other's are its row's, with a clone of its own."""
    if repository.is_default:
        base = default_target()
        return Target(
            repository_id=repository.pk,
            name=repository.name,
            location=base.location,
            clone=base.clone,
            target_branch=repository.target_branch or base.target_branch,
            verify_commands=(*base.verify_commands, *repository.verify_commands),
            environment=repository.environment,
        )
    return Target(
        repository_id=repository.pk,
        name=repository.name,
        location=repository.location,
        clone=Path(settings.ANNIHILATION_HOME) / "clones" / f"r-{repository.pk}",
        target_branch=repository.target_branch,
        verify_commands=tuple(repository.verify_commands),
        environment=repository.environment,
    )


def current() -> Target:
    """The repository the code at hand works on (the default one outside `working_on`)."""
    return _current.get() or default_target()


def current_is_default() -> bool:
    target = _current.get()
    return target is None or target.location == default_target().location


@contextmanager
def working_on(repository: Repository | Target) -> Iterator[Target]:
    """Work on `repository` for the block (blocks nest; the innermost wins)."""
    target = repository if isinstance(repository, Target) else target_of(repository)
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


@contextmanager
def working_on_id(repository_id: int | None) -> Iterator[Target]:
    """`working_on` the repository of that id; None or a row since gone: the default one."""
    repository = (
        Repository.objects.filter(pk=repository_id).first() if repository_id is not None else None
    )
    if repository is None:
        with working_on(default_target()) as target:
            yield target
        return
    with working_on(repository) as target:
        yield target


def repository_id_of_quantum(quantum_id: int) -> int | None:
    """The repository a quantum belongs to (None when the quantum is gone)."""
    return Repository.objects.filter(quanta__pk=quantum_id).values_list("pk", flat=True).first()


@contextmanager
def working_on_quantum(quantum_id: int) -> Iterator[Target]:
    """`working_on` the repository of a quantum."""
    with working_on_id(repository_id_of_quantum(quantum_id)) as target:
        yield target


def require(repository_id: int) -> Repository:
    repository = Repository.objects.filter(pk=repository_id).first()
    if repository is None:
        raise RepositoryNotFound(f"no repository #{repository_id}")
    return repository
