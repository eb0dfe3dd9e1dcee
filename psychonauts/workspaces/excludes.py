"""What the runtime's commits leave out: the exclude list (caches, virtualenvs, build outputs),
written per worktree and read by git through `core.excludesFile` on the runtime's own commands."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from django.conf import settings

from psychonauts.errors import WorkspaceError
from psychonauts.workspaces.git import submodules_left_out

# What the runtime never commits, whatever the repository's .gitignore says (or lacks): caches,
# virtualenvs, dependencies and build and coverage outputs that running the target's tools
# leaves behind. settings.COMMIT_EXCLUDE_EXTRA adds to it. Files already tracked stay tracked
# (an ignore rule only hides untracked files from `git add -A`).
COMMIT_EXCLUDES = (
    "__pycache__/",
    "*.py[cod]",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
    ".nox/",
    ".venv/",
    "venv/",
    "node_modules/",
    "build/",
    "dist/",
    "*.egg-info/",
    ".eggs/",
    ".coverage",
    ".coverage.*",
    "coverage.xml",
    "htmlcov/",
    ".cache/",
    ".DS_Store",
)

EXCLUDE_FILE = "annihilation-exclude"


def commit_excludes() -> tuple[str, ...]:
    return (*COMMIT_EXCLUDES, *settings.COMMIT_EXCLUDE_EXTRA)


def _git_dir(workspace: Path) -> Path:
    """The worktree's own git folder (`.git` itself, or the folder its `.git` file points to),
    read without a git process: a commit is on every agent's hot path."""
    dot_git = workspace / ".git"
    if dot_git.is_dir():
        return dot_git
    text = dot_git.read_text(encoding="utf-8").strip()
    if not text.startswith("gitdir:"):
        raise WorkspaceError(f"{dot_git} is neither a git folder nor a gitdir pointer")
    found = Path(text.removeprefix("gitdir:").strip())
    return found if found.is_absolute() else (workspace / found).resolve()


def excludes_file(workspace: Path) -> Path:
    """The exclude file of this worktree, written in its own git folder when missing or out of
    date. Not `info/exclude` (all worktrees of a repository share it) nor the repository's
    config: the target repository is not modified; git reads it through `core.excludesFile`
    on the runtime's own commands only."""
    path = _git_dir(workspace) / EXCLUDE_FILE
    text = "".join(f"{pattern}\n" for pattern in commit_excludes())
    try:
        current = path.read_text(encoding="utf-8")
    except OSError:
        current = None
    if current != text:
        # Written aside and renamed: a concurrent reader sees the old file or the new one.
        aside = path.with_name(f"{EXCLUDE_FILE}.{os.getpid()}.{threading.get_native_id()}")
        aside.write_text(text, encoding="utf-8")
        aside.replace(path)
    return path


def add_all_args(workspace: Path, *, index_file: Path | None = None) -> list[str]:
    """`git add -A` of everything the agent changed but the excludes (COMMIT_EXCLUDES) and the
    submodules whose folder holds a repository (psychonauts/workspaces/git.py: the runtime never moves a
    submodule)."""
    left_out = submodules_left_out(workspace, index_file=index_file)
    return [
        "-c",
        f"core.excludesFile={excludes_file(workspace)}",
        "add",
        "-A",
        "--",
        ".",
        *left_out,
    ]
