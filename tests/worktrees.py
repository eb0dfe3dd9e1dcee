"""A `git worktree add` caught half-way, for tests of what must wait for one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psychonauts.workspaces.repository import registry_lock


@contextmanager
def worktree_being_added(repo: Path) -> Iterator[Path]:
    """Another add in flight: its record half-written (an empty `commondir`, as git leaves it
    between creating the file and writing it) and the worktree lock held shared. On leaving,
    the add finishes writing its record and lets go of the lock."""
    record = repo / ".git" / "worktrees" / "q-999"
    record.mkdir(parents=True)
    (record / "locked").write_text("initializing")
    (record / "gitdir").write_text(str(repo.parent / "q-999" / ".git"))
    (record / "commondir").write_text("")
    with registry_lock(shared=True):
        yield record
        (record / "commondir").write_text("../..\n")
