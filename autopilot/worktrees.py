"""Where a goal's verify commands run: a scratch worktree of the repository detached at the
integration branch's tip, one per goal, gone once the commands have run; and the lock that keeps
two verifications of one goal from running at once."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from django.conf import settings

from psychonauts.workspaces.central import shared_lock_try
from psychonauts.workspaces.git import git_run
from psychonauts.workspaces.repository import registry_lock, repo_local
from psychonauts.workspaces.worktrees import scratch_worktree


def verify_lock(goal_id: int) -> AbstractContextManager[bool]:
    """One verification of a goal at a time, on any host (without waiting: True when held)."""
    return shared_lock_try(f"goal-verify-{goal_id}")


def scratch_at(goal_id: int, sha: str) -> Path:
    """A worktree detached at `sha`, for the goal's verification only."""
    return scratch_worktree(Path(settings.ANNIHILATION_HOME) / "goals" / f"verify-{goal_id}", sha)


def scratch_remove(where: Path) -> None:
    """The scratch worktree gone (its folder and git's record of it)."""
    with registry_lock(shared=True):
        git_run("worktree", "remove", "--force", str(where), cwd=repo_local())
