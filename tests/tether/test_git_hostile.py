"""A change whose files try to configure git: nothing of it runs in any git process of ours.

An agent's commit carries git configuration where a HOME or XDG_CONFIG_HOME pointed at the tree
would find it (`.gitconfig`, `.config/git/config`), attributes naming filter, diff and merge
drivers (`.gitattributes`, `.config/git/attributes`), hooks and a hooks path, a `.gitmodules`
whose URL is an `ext::` command, and a nested repository with a configuration of its own. Every
program any of it names writes a marker file outside the tree. Each caller of git runs over it
for real (the runtime's commits, the review, the merge queue, the scanners, the checks on the
integration branch, remote mode's fetch and push), and no marker may appear.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autopilot.scanners.tree import (
    blame_commits,
    blobs_read,
    merged_recently,
    tree_export,
    tree_files,
)
from autopilot.services.healing import base_check_run
from autopilot.services.scanners import scan_run
from autopilot.worktrees import scratch_at, scratch_remove
from bursts.models import Burst, QuantumRun, RunStatus, Wave
from psychonauts.focus import worktree_diff
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.models import Quantum
from tether.models import ChangeReview, ChangeStatus
from tether.services import change_approve, change_review_create
from tether.services.merge_queue import merge_queue_run

HOOKS = (
    "pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
    "post-merge", "pre-merge-commit", "pre-push", "reference-transaction", "post-rewrite",
    "pre-auto-gc", "post-index-change", "fsmonitor-watchman",
)  # fmt: skip


def hostile_config(marks: Path) -> str:
    """git configuration in which every program git may run writes a marker."""

    def run(name: str) -> str:
        return f'"touch {marks}/{name}; cat"'

    return f"""[core]
\tfsmonitor = "touch {marks}/fsmonitor; echo"
\thooksPath = .githooks
\tpager = {run("pager")}
\tsshCommand = "touch {marks}/ssh; false"
\taskPass = "touch {marks}/askpass; false"
[filter "evil"]
\tclean = {run("filter-clean")}
\tsmudge = {run("filter-smudge")}
[diff "evil"]
\ttextconv = {run("textconv")}
[diff]
\texternal = "touch {marks}/external-diff; true"
[merge "evil"]
\tdriver = "touch {marks}/merge-driver; true"
[submodule]
\trecurse = true
[fetch]
\trecurseSubmodules = true
[protocol]
\tallow = always
[credential]
\thelper = "!touch {marks}/credential; true"
[gc]
\tauto = 1
"""


ATTRIBUTES = "* filter=evil diff=evil merge=evil\n"


def plant(tree: Path, marks: Path) -> None:
    """The hostile files, written in a worktree as an agent's commands would write them."""
    config = hostile_config(marks)
    files = {
        ".gitconfig": config,
        ".config/git/config": config,
        ".config/git/attributes": ATTRIBUTES,
        ".gitattributes": ATTRIBUTES,
        "docs/.gitattributes": ATTRIBUTES,
        ".gitmodules": (
            f'[submodule "evil"]\n\tpath = vendor/evil\n\turl = ext::sh -c touch% {marks}/ext-url\n'
        ),
        "docs/notes.md": "notes\n",
    }
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text, encoding="utf-8")
    for hook in HOOKS:
        path = tree / ".githooks" / hook
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"#!/bin/sh\ntouch {marks}/hook-{hook}\n", encoding="utf-8")
        path.chmod(0o755)
    # A repository inside the tree (the runtime's `git add` records it as a submodule), with a
    # configuration and attributes of its own.
    nested = tree / "vendor" / "evil"
    nested.mkdir(parents=True)
    (nested / ".gitattributes").write_text(ATTRIBUTES, encoding="utf-8")
    (nested / "inner.txt").write_text("inner\n", encoding="utf-8")
    plain = {**os.environ, "HOME": str(marks.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (
        ("init", "-q"),
        ("add", "-A"),
        ("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "x"),
    ):
        subprocess.run(["git", *args], cwd=nested, env=plain, check=True)
    with (nested / ".git" / "config").open("a", encoding="utf-8") as handle:
        handle.write(hostile_config(marks).replace("hooksPath = .githooks", "hooksPath = hooks"))


def stir(tree: Path) -> None:
    """Changes that make git look at every file again (and inside the nested repository)."""
    for path in (tree / "vendor" / "evil" / "inner.txt", tree / "docs/notes.md"):
        path.write_text(path.read_text(encoding="utf-8").upper(), encoding="utf-8")
        os.utime(path, (1_000_000_000, 1_000_000_000))
    with (tree / "calc.py").open("a", encoding="utf-8") as calc:
        calc.write("\n# stirred\n")


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    folder.chmod(0o777)  # a sandboxed command could write here too: only git's would
    return folder


def written(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


def hostile_run(quantum: Quantum, marks: Path) -> QuantumRun:
    """A finished run of the quantum whose agent committed the hostile files (twice, the second
    time with every file changed), through the runtime's commit."""
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE,
        branch=branch_for(quantum.pk),
    )  # fmt: skip
    tree = workspace_ensure(quantum_id=quantum.pk)
    plant(tree, marks)
    assert workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="a", role="coder")
    stir(tree)
    assert workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="a", role="coder")
    return run


def plain_run(quantum: Quantum, files: dict[str, str]) -> QuantumRun:
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE,
        branch=branch_for(quantum.pk),
    )  # fmt: skip
    tree = workspace_ensure(quantum_id=quantum.pk)
    for name, text in files.items():
        (tree / name).write_text(text, encoding="utf-8")
    workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="b", role="coder")
    return run


def test_the_runtimes_commits_run_nothing_of_the_tree(
    db: None, repo: Path, make_quantum: Any, marks: Path
) -> None:
    quantum = make_quantum()
    hostile_run(quantum, marks)

    assert written(marks) == []
    tree = git("ls-tree", "-r", "--name-only", branch_for(quantum.pk), cwd=repo).splitlines()
    assert {".gitconfig", ".config/git/config", ".gitattributes", ".githooks/post-commit"} <= set(
        tree
    )


def test_the_review_the_focus_diff_and_the_merge_queue_run_nothing_of_the_change(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any, marks: Path
) -> None:
    tether_settings.TETHER_VERIFY_COMMANDS = ["test -f calc.py"]
    # The second change starts before the first is merged and edits the same file: its merge
    # is a real three-way merge of calc.py, on a target that now holds the hostile files.
    later = make_quantum("later")
    later_tree = workspace_ensure(quantum_id=later.pk)
    calc = (later_tree / "calc.py").read_text(encoding="utf-8")
    hostile = make_quantum("hostile")
    run = hostile_run(hostile, marks)

    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None
    assert review.risk == "high"
    assert any("git configuration" in reason for reason in review.reasons)
    assert worktree_diff(quantum_id=hostile.pk)
    change_approve(change_id=review.pk)
    merge_queue_run()
    assert ChangeReview.objects.get(pk=review.pk).status == ChangeStatus.MERGED

    second = change_review_create(
        quantum_run_id=plain_run(later, {"calc.py": '"""Calc."""\n' + calc}).pk
    )
    assert second is not None
    change_approve(change_id=second.pk)
    merge_queue_run()

    assert ChangeReview.objects.get(pk=second.pk).status == ChangeStatus.MERGED
    assert written(marks) == []
    assert (repo / ".gitconfig").exists()  # the target's checkout holds the files now


def test_the_scanners_and_the_checks_on_the_target_run_nothing_of_it(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any, marks: Path, tmp_path: Path
) -> None:
    tether_settings.TETHER_VERIFY_COMMANDS = ["test -f calc.py"]
    hostile = make_quantum("hostile")
    review = change_review_create(quantum_run_id=hostile_run(hostile, marks).pk)
    assert review is not None
    change_approve(change_id=review.pk)
    merge_queue_run()
    sha = git("rev-parse", "main", cwd=repo)

    files, _ = tree_files(repo, sha)
    assert dict(blobs_read(repo, [f.oid for f in files if f.path == "calc.py"]))
    tree_export(repo, sha, tmp_path / "export")
    assert (tmp_path / "export" / ".gitconfig").exists()
    assert blame_commits(repo, sha, "calc.py")
    assert merged_recently(repo, "main", since=_epoch()).paths
    assert not scan_run().errors
    check = base_check_run()
    assert check is not None and check.ok
    where = scratch_at(1, sha)
    assert (where / ".gitattributes").exists()
    scratch_remove(where)

    assert written(marks) == []


def test_remote_mode_fetches_and_pushes_nothing_of_it_either(
    db: None, repo: Path, settings: Any, make_quantum: Any, marks: Path, tmp_path: Path
) -> None:
    central = tmp_path / "central.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(central)], check=True)
    settings.ANNIHILATION_REPO = f"file://{central}"
    settings.ANNIHILATION_CLONE = tmp_path / "home" / "clone"
    quantum = make_quantum()

    hostile_run(quantum, marks)
    # Another worktree of the same branch on this host: fetched and brought to the tip.
    assert git("rev-parse", f"refs/heads/{branch_for(quantum.pk)}", cwd=central)
    assert workspace_ensure(quantum_id=quantum.pk)

    assert written(marks) == []


def _epoch() -> Any:
    from datetime import UTC, datetime

    return datetime(2000, 1, 1, tzinfo=UTC)
