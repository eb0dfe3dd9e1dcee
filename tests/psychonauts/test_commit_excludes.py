"""The runtime's commit holds the agent's work only: caches and build outputs that running the
target's tools leaves behind are never committed, whether or not the repository ignores them,
and the change review lists what was left out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bursts.models import Burst, QuantumRun, RunStatus, Wave
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.services import quantum_create
from tether.services import change_review_create


def _tree(repo: Path, ref: str) -> list[str]:
    return git("ls-tree", "-r", "--name-only", ref, cwd=repo).splitlines()


def _without_gitignore(repo: Path) -> None:
    """The demo repository, minus its .gitignore, plus a tracked file under build/."""
    git("rm", "-q", ".gitignore", cwd=repo)
    (repo / "build").mkdir()
    (repo / "build" / "keep.txt").write_text("tracked\n")
    git("add", "build/keep.txt", cwd=repo)
    git("commit", "-q", "-m", "no .gitignore", cwd=repo)


def _done_run(quantum_id: int) -> QuantumRun:
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    return QuantumRun.objects.create(
        wave=wave, burst=burst, quantum_id=quantum_id, status=RunStatus.DONE,
        branch=branch_for(quantum_id),
    )  # fmt: skip


def test_it_never_commits_what_running_the_test_suite_generated(
    db: None, repo: Path, settings: Any
) -> None:
    settings.TETHER_AUTO_MERGE_LOW_RISK = False
    settings.TETHER_TARGET_BRANCH = ""
    settings.COMMIT_EXCLUDE_EXTRA = ["*.log"]
    _without_gitignore(repo)
    config_before = (repo / ".git" / "config").read_text()
    quantum = quantum_create(title="Add subtract")
    tree = workspace_ensure(quantum_id=quantum.pk)
    (tree / "calc.py").write_text(
        (tree / "calc.py").read_text() + "\n\ndef sub(a: int, b: int) -> int:\n    return a - b\n"
    )
    (tree / "test_sub.py").write_text("from calc import sub\n\n\ndef test_sub() -> None:\n"
                                      "    assert sub(3, 2) == 1\n")  # fmt: skip
    # What an agent's test run leaves: bytecode caches, pytest's cache, a log, a build output.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "test_calc.py", "test_sub.py"],
        cwd=tree, capture_output=True, text=True, check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tree / "__pycache__").is_dir() and (tree / ".pytest_cache").is_dir()
    (tree / "run.log").write_text("noise\n")
    (tree / "build" / "keep.txt").write_text("tracked, changed\n")
    (tree / "build" / "out.bin").write_text("generated\n")

    sha = workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="a1", role="coder")

    committed = _tree(repo, sha)
    assert "calc.py" in committed and "test_sub.py" in committed
    assert not [p for p in committed if "__pycache__" in p or ".pytest_cache" in p]
    assert "run.log" not in committed and "build/out.bin" not in committed
    # Already tracked: stays tracked, its change committed.
    assert git("show", f"{sha}:build/keep.txt", cwd=repo) == "tracked, changed"
    # The target repository itself is not modified.
    assert (repo / ".git" / "config").read_text() == config_before
    info_exclude = repo / ".git" / "info" / "exclude"
    assert not info_exclude.exists() or "__pycache__" not in info_exclude.read_text()

    review = change_review_create(quantum_run_id=_done_run(quantum.pk).pk)

    assert review is not None
    assert {"__pycache__/", ".pytest_cache/", "run.log", "build/out.bin"} <= set(review.left_out)
    assert [f["path"] for f in review.files] == ["build/keep.txt", "calc.py", "test_sub.py"]


def test_it_leaves_out_what_the_repository_ignores_and_commits_the_rest(
    db: None, repo: Path, settings: Any
) -> None:
    (repo / ".gitignore").write_text("secret-notes/\n")
    git("add", ".gitignore", cwd=repo)
    git("commit", "-q", "-m", "ignore notes", cwd=repo)
    quantum = quantum_create(title="notes")
    tree = workspace_ensure(quantum_id=quantum.pk)
    (tree / "secret-notes").mkdir()
    (tree / "secret-notes" / "n.txt").write_text("x\n")
    (tree / "node_modules" / "lib").mkdir(parents=True)
    (tree / "node_modules" / "lib" / "index.js").write_text("x\n")
    (tree / "docs.md").write_text("kept\n")

    sha = workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="a1", role="coder")

    assert set(_tree(repo, sha)) - set(_tree(repo, "main")) == {"docs.md"}
