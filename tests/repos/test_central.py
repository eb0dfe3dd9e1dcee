"""A repository registered by URL works as ANNIHILATION_REPO given as a URL does: through a clone
of its own on this host, its branches pushed to it; the default repository stays local."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from psychonauts.workspaces.git import git
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure, workspace_commit, workspace_ensure
from quanta.services import quantum_create
from repos.context import working_on_quantum
from repos.errors import InvalidRepository
from repos.services import repository_create

pytestmark = pytest.mark.django_db


def test_a_repository_by_url_has_its_own_clone_and_gets_its_branches(
    repo: Path, settings, tmp_path: Path
) -> None:
    central = tmp_path / "central.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(demo_repo_ensure(tmp_path / "src")), str(central)],
        check=True,
    )
    second = repository_create(
        name="second", location=f"file://{central}", target_branch="main",
        inspect=repository_inspect,
    )  # fmt: skip
    quantum = quantum_create(title="remote work", repository_id=second.pk)

    with working_on_quantum(quantum.pk):
        tree = workspace_ensure(quantum_id=quantum.pk)
        (tree / "remote.txt").write_text("pushed\n")
        workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="t", role="coder")

    clone = Path(settings.ANNIHILATION_HOME) / "clones" / f"r-{second.pk}"
    assert (clone / ".git").is_dir()
    assert not Path(settings.ANNIHILATION_CLONE).exists()  # the default one stays local
    pushed = git("show", f"{branch_for(quantum.pk)}:remote.txt", cwd=central)
    assert pushed == "pushed"
    local = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch_for(quantum.pk)}"],
        cwd=repo, capture_output=True,
    )  # fmt: skip
    assert local.returncode != 0


def test_a_url_without_the_branch_or_a_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    central = tmp_path / "central.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(demo_repo_ensure(tmp_path / "src")), str(central)],
        check=True,
    )
    with pytest.raises(InvalidRepository, match="has no branch 'release'"):
        repository_create(
            name="x", location=f"file://{central}", target_branch="release",
            inspect=repository_inspect,
        )  # fmt: skip
    with pytest.raises(InvalidRepository, match="not a reachable git repository"):
        repository_create(
            name="x", location=f"file://{tmp_path / 'nothing.git'}", inspect=repository_inspect
        )
