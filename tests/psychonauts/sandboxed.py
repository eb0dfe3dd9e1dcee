"""Real worktrees of a real repository, for tests that run agents' commands in the sandbox."""

from __future__ import annotations

from pathlib import Path

from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.containment.sandbox import sandbox_status
from psychonauts.runtime.tools import ToolContext
from psychonauts.workspaces.git import git
from psychonauts.workspaces.worktrees import workspace_ensure


def worktrees(tmp_path: Path, settings: SettingsWrapper, *quanta: int) -> dict[int, Path]:
    """A repository with one commit, and a worktree of it for each quantum, sandbox on."""
    settings.ANNIHILATION_HOME = tmp_path / "home"
    settings.PSYCHONAUTS_WORKTREES = tmp_path / "home" / "worktrees"
    settings.PSYCHONAUTS_WORKSPACE_MODE = "worktree"
    settings.SANDBOX_MODE = "on"
    settings.SANDBOX_NETWORK = False
    settings.SANDBOX_PROCESSES = 64
    settings.SANDBOX_MEMORY_BYTES = 512 * 2**20
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "README.md").write_text("# demo\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init", cwd=repo)
    settings.ANNIHILATION_REPO = repo
    assert sandbox_status().state == "on", sandbox_status().detail
    return {quantum: workspace_ensure(quantum_id=quantum) for quantum in quanta}


def agent_context(quantum_id: int, workspace: Path) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id=f"{quantum_id}_s0_coder", attempt=1, quantum_id=quantum_id,
        role="coder", depth=0, workspace=workspace, shared=False,
    )  # fmt: skip
