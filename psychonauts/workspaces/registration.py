"""Checks of a repository before it is registered (repos.services takes them as `inspect`):
a local location is a git repository's top folder with the target branch; a URL answers git
and has the branch."""

from __future__ import annotations

import subprocess
from pathlib import Path

from django.conf import settings

from psychonauts.workspaces.git import git_run
from repos.context import Target, working_on
from repos.errors import InvalidRepository

# How long a central repository may take to list its branches.
LS_REMOTE_TIMEOUT_S = 30.0


def repository_inspect(location: str, target_branch: str) -> None:
    """InvalidRepository when `location` is not a git repository or has no `target_branch`
    ("" = the branch it has checked out, which must exist)."""
    if location.startswith("/"):
        _local_inspect(Path(location), target_branch)
    else:
        _remote_inspect(location, target_branch)


def _local_inspect(path: Path, branch: str) -> None:
    if not path.is_dir():
        raise InvalidRepository(f"{path} is not a folder")
    if not (path / ".git").exists():
        raise InvalidRepository(
            f"{path} is not a git repository (no .git; give the repository's top folder)"
        )
    # Its own git runs with this repository as the project's (safe.directory is per target).
    target = Target(
        repository_id=None,
        name="",
        location=str(path),
        clone=path,
        target_branch=branch,
        verify_commands=(),
    )
    with working_on(target):
        top = git_run("rev-parse", "--show-toplevel", cwd=path, timeout=30)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != path.resolve():
            raise InvalidRepository(f"{path} is not a git repository's top folder")
        if not branch:
            head = git_run("symbolic-ref", "--short", "-q", "HEAD", cwd=path, timeout=30)
            if head.returncode != 0:
                raise InvalidRepository(
                    f"{path} has no branch checked out (a detached HEAD): name a target branch"
                )
            return
        found = git_run(
            "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", cwd=path
        )
        if found.returncode != 0:
            raise InvalidRepository(f"{path} has no branch {branch!r}")


def _remote_inspect(url: str, branch: str) -> None:
    home = Path(settings.ANNIHILATION_HOME)
    home.mkdir(parents=True, exist_ok=True)
    try:
        listed = git_run(
            "ls-remote", "--symref", url, *((f"refs/heads/{branch}",) if branch else ("HEAD",)),
            cwd=home, timeout=LS_REMOTE_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InvalidRepository(f"{url} did not answer within {LS_REMOTE_TIMEOUT_S:.0f}s") from None
    if listed.returncode != 0:
        why = (listed.stderr.strip().splitlines() or ["no answer"])[-1]
        raise InvalidRepository(f"{url} is not a reachable git repository: {why}")
    if not listed.stdout.strip():
        raise InvalidRepository(
            f"{url} has no branch {branch!r}" if branch else f"{url} has no HEAD branch"
        )
