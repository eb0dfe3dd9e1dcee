"""The current repository as git sees it (repos.context: a quantum's own, the default one being
ANNIHILATION_REPO): where git runs (`repo_local`: the repository itself, or this host's clone of a
central repository), its key, its file locks, and its quanta's branches. The worktrees
(worktrees.py) and the central repository's fences and pushes (central.py) build on it."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from django.conf import settings

from psychonauts.workspaces.git import network
from repos.context import current

logger = logging.getLogger(__name__)

# Locks keyed by quantum or workspace map onto this many files per kind, so the lock folder
# stays the same size however many quanta a repository has seen (a lock file cannot be deleted
# safely: a process may have it open, about to lock it). Two quanta that share a stripe only
# wait for each other's git step; no code holds two locks of one kind at once.
LOCK_STRIPES = 256


def stripe(key: str | int) -> int:
    """The lock stripe of a quantum id or a path: stable across processes (not `hash`)."""
    if isinstance(key, int):
        return key % LOCK_STRIPES
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % LOCK_STRIPES


@contextmanager
def file_lock(name: str, *, shared: bool = False) -> Iterator[None]:
    """A lock across processes on this machine (git refuses concurrent writers): exclusive, or
    shared with other shared holders. Not reentrant: a holder must not take it again."""
    folder = Path(settings.ANNIHILATION_HOME) / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def file_lock_try(name: str) -> Iterator[bool]:
    """`file_lock`, exclusive, without waiting: True when held (for the block), False when
    another process holds it. The lock goes with its process: one that dies lets it go."""
    folder = Path(settings.ANNIHILATION_HOME) / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def repo_url() -> str:
    """The central repository's URL, or "" when the current repository (repos.context: the
    default one is ANNIHILATION_REPO) is a local path."""
    return current().url


def repo_local() -> Path:
    """The local git repository to run git in: the current repository itself (a local path), or
    this host's clone of its central repository, made on first use (a URL)."""
    target = current()
    if not target.url:
        return Path(target.location)
    return clone_ensure(target.url)


def repo_key() -> str:
    """A short key of the current repository: its locks, scratch folders and merge queue; the
    same on every host for a central repository (its URL)."""
    target = current()
    repo = target.url or str(Path(target.location).resolve())
    return hashlib.sha1(repo.encode()).hexdigest()[:16]


def repo_lock(kind: str, *, shared: bool = False) -> AbstractContextManager[None]:
    """A lock of one `kind` on the target repository (ANNIHILATION_REPO) as a whole."""
    return file_lock(f"{kind}-{repo_key()}", shared=shared)


def registry_lock(*, shared: bool) -> AbstractContextManager[None]:
    """The repository's list of worktrees. `git worktree prune` (git gc runs it too) deletes the
    record of a worktree that `worktree add` is still creating, failing the add: adding and
    removing hold this lock shared, pruning and maintenance hold it exclusive."""
    return repo_lock("worktrees", shared=shared)


def branch_for(quantum_id: int) -> str:
    return f"annihilation/q-{quantum_id}"


def clone_path() -> Path:
    """This host's clone of the current repository's central one (repos.context)."""
    return current().clone


def clone_ensure(url: str) -> Path:
    """This host's clone of the central repository (repo_local): made on first use,
    under a lock of this host, aside and renamed into place, so a clone is whole or absent.
    `--no-checkout`: nobody works in the clone's own tree, only in worktrees of it."""
    path = clone_path()
    if (path / ".git").is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(f"clone-{repo_key()}"):
        if (path / ".git").is_dir():
            return path
        aside = path.with_name(f"{path.name}.{os.getpid()}.partial")
        shutil.rmtree(aside, ignore_errors=True)  # a clone a dead process of ours began
        network("clone", "--quiet", "--no-checkout", url, str(aside), cwd=path.parent)
        aside.rename(path)
        logger.info("cloned the central repository into %s", path, extra={"clone": str(path)})
    return path
