"""The git runner: what the worker's environment and other users' repositories cannot do to it.

(What a repository's own files cannot do: tests/tether/test_git_hostile.py.)
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from psychonauts.workspaces.git import git, git_run, submodules_left_out
from psychonauts.workspaces.worktrees import workspace_ensure


def test_it_ignores_the_git_variables_and_home_of_the_worker(
    db: None, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    home = tmp_path / "worker-home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "touch {marks}/home; echo"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "index"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.hookspath'='{tmp_path}'")
    (repo / "calc.py").write_text("changed\n")

    assert git("status", "--porcelain", cwd=repo) == "M calc.py"
    assert list(marks.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a tree another user owns")
def test_it_works_in_the_projects_trees_of_other_users_and_in_no_other(
    db: None, repo: Path, tmp_path: Path
) -> None:
    tree = workspace_ensure(quantum_id=3)  # given to the quantum's sandbox user
    assert tree.stat().st_uid != 0
    assert git_run("status", cwd=tree).returncode == 0

    stranger = tmp_path / "stranger"
    stranger.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=stranger, check=True)
    for path in (stranger, *stranger.rglob("*")):
        os.lchown(path, 54321, 54321)
    # An agent's tree holding a repository of its own is no worktree of the project either.
    nested = tree / "nested"
    nested.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=nested, check=True)
    for path in (nested, *nested.rglob("*")):
        os.lchown(path, tree.stat().st_uid, tree.stat().st_gid)

    for folder in (stranger, nested):
        refused = git_run("status", cwd=folder)
        assert refused.returncode != 0 and "dubious ownership" in refused.stderr


def test_it_refuses_the_transport_that_runs_a_command(
    db: None, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As an operator's environment or configuration might allow it for their own use.
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "ext:file")
    git("config", "protocol.ext.allow", "always", cwd=repo)
    marker = tmp_path / "ran"

    proc = git_run("ls-remote", f"ext::sh -c touch% {marker}", cwd=repo)

    assert proc.returncode != 0 and "transport 'ext' not allowed" in proc.stderr
    assert not marker.exists()


def test_it_never_looks_inside_a_submodule_whose_folder_holds_a_repository(
    db: None, repo: Path, tmp_path: Path
) -> None:
    """A repository made in a submodule's folder (by an agent, or by a check in a scratch
    worktree) brings a configuration of its own: `git status` inside it would run its filters."""
    marks = tmp_path / "marks"
    marks.mkdir()
    nested = repo / "vendor" / "x"
    nested.mkdir(parents=True)
    (nested / ".gitattributes").write_text("* filter=evil\n")
    (nested / "file.txt").write_text("one\n")
    plain = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=a", "-c", "user.email=a@b",
                                                 "commit", "-qm", "x"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=nested, env=plain, check=True)
    with (nested / ".git" / "config").open("a") as config:
        config.write(f'[filter "evil"]\n\tclean = "touch {marks}/clean; cat"\n')
    git("add", "vendor/x", cwd=repo)  # a submodule of the repository now
    (repo / ".gitmodules").write_text('[submodule "x"]\n\tpath = vendor/x\n\tignore = none\n')
    git("commit", "-qm", "a submodule", cwd=repo)
    (nested / "file.txt").write_text("two\n")  # same size, new time: read again

    git("status", "--porcelain", cwd=repo)
    git("diff", "--name-only", cwd=repo)
    git(*("stash", "push", "--include-untracked", "--", "."), *submodules_left_out(repo), cwd=repo)

    assert list(marks.iterdir()) == []


APPS: list[str] = list(settings.PROJECT_APPS)


def git_processes_outside_the_runner(root: Path) -> list[str]:
    """Calls whose command line is a list starting with "git", anywhere in the apps but the
    runner itself."""
    found = []
    for app in APPS:
        for path in sorted((root / app).rglob("*.py")):
            if path == root / "psychonauts" / "git.py" or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                first = node.args[0]
                if (
                    isinstance(first, ast.List | ast.Tuple)
                    and first.elts
                    and isinstance(first.elts[0], ast.Constant)
                    and first.elts[0].value == "git"
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_git_process_of_the_apps_goes_through_the_runner(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    assert git_processes_outside_the_runner(root) == []
    # The check sees one.
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "m.py").write_text(
        "import subprocess\nsubprocess.run(['git', 'status'], check=False)\n"
    )
    assert git_processes_outside_the_runner(tmp_path) == ["core/m.py:2"]
