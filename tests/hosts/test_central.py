"""The central repository: ANNIHILATION_REPO as a URL, stages on several hosts, fenced pushes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from psychonauts.containment.sandbox import sandbox_uid
from psychonauts.workspaces.central import CentralConflict, Fence, StaleExecution, fence_take
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for, clone_path, repo_local
from psychonauts.workspaces.worktrees import (
    demo_repo_ensure,
    workspace_commit,
    workspace_ensure,
    workspace_prepare,
    workspace_ready,
)
from reflection.injection import agents_md
from tests.hosts.conftest import Central, Host

ROOT = Path(__file__).resolve().parents[2]
MakeHost = Callable[[str, Central], Host]
# A root worker's sandbox uids are rows of the database, read from the hosts' threads too.
pytestmark = pytest.mark.django_db(transaction=True)


def _settings_value(value: str) -> subprocess.CompletedProcess[str]:
    """Load the project's settings with ANNIHILATION_REPO=value in a fresh interpreter."""
    code = "from django.conf import settings; print(repr(settings.ANNIHILATION_REPO))"
    env = {
        **os.environ,
        "ANNIHILATION_REPO": value,
        "DJANGO_SETTINGS_MODULE": "annihilation.settings",
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "value",
    [
        "ssh://git@example.com/team/app.git",
        "https://example.com/team/app.git",
        "git://127.0.0.1:9418/app.git",
        "file:///srv/git/app.git",
        "git@example.com:team/app.git",
    ],
)
def test_it_accepts_a_url_or_scp_form_as_is(value: str) -> None:
    proc = _settings_value(value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(value)


def test_it_keeps_a_local_path_a_path(tmp_path: Path) -> None:
    proc = _settings_value(str(tmp_path / "x" / ".." / "repo"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(tmp_path / "repo")


@pytest.mark.parametrize(
    "value, complaint",
    [
        ("ftp://example.com/app.git", "unknown scheme"),
        ("https://example.com", "names no repository"),
        ("host:path", "neither a local path nor a URL"),
        ("/srv/my repo", "whitespace"),
    ],
)
def test_it_refuses_garbage_at_start_up(value: str, complaint: str) -> None:
    proc = _settings_value(value)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and complaint in proc.stderr


def _write(tree: Path, name: str, text: str) -> None:
    (tree / name).parent.mkdir(parents=True, exist_ok=True)
    (tree / name).write_text(text, encoding="utf-8")


def _land(host: Host, quantum_id: int, agent_id: str, files: dict[str, str]) -> str:
    """One agent's stage on `host`: fence, worktree, its files, its commit pushed."""
    with host.active():
        fence = Fence(agent_id)
        tree = workspace_ready(
            workspace_prepare(quantum_id=quantum_id, fence=fence),
            quantum_id=quantum_id,
            fence=fence,
        )
        for name, text in files.items():
            _write(tree, name, text)
        return workspace_commit(
            workspace=tree, quantum_id=quantum_id, agent_id=agent_id, role="coder", fence=fence
        )


def test_a_stage_on_host_b_sees_host_a_commit(make_host: MakeHost, daemon_central: Central) -> None:
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    sha = _land(a, 7, "q7-planner", {"PLAN.md": "the plan\n"})
    assert daemon_central.tip(branch_for(7)) == sha
    with b.active():
        tree = workspace_ensure(quantum_id=7)
        assert (tree / "PLAN.md").read_text() == "the plan\n"
        assert git("rev-parse", "HEAD", cwd=tree) == sha
    later = _land(b, 7, "q7-coder", {"calc.py": "def add(a, b):\n    return a + b\n"})
    with a.active():  # host A's worktree exists already: brought to the central tip
        tree = workspace_ensure(quantum_id=7)
        assert git("rev-parse", "HEAD", cwd=tree) == later
    assert daemon_central.log(branch_for(7))[:2] == [
        "q-7: q7-coder (coder)",
        "q-7: q7-planner (coder)",
    ]


def test_fan_out_siblings_on_two_hosts_both_land_once(
    make_host: MakeHost, daemon_central: Central
) -> None:
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    fences = {"q3-left": Fence("q3-left"), "q3-right": Fence("q3-right")}
    trees = {}
    for host, agent in ((a, "q3-left"), (b, "q3-right")):  # both start from the same tip
        with host.active():
            fence_take(fences[agent])
            trees[agent] = workspace_ensure(quantum_id=3)
    _write(trees["q3-left"], "left.py", "LEFT = 1\n")
    _write(trees["q3-right"], "right.py", "RIGHT = 2\n")
    with a.active():
        first = workspace_commit(
            workspace=trees["q3-left"], quantum_id=3, agent_id="q3-left", role="coder",
            fence=fences["q3-left"],
        )  # fmt: skip
    with b.active():  # replayed on what host A pushed
        second = workspace_commit(
            workspace=trees["q3-right"], quantum_id=3, agent_id="q3-right", role="coder",
            fence=fences["q3-right"],
        )  # fmt: skip
        assert git("rev-parse", "HEAD", cwd=trees["q3-right"]) == second
        assert (trees["q3-right"] / "left.py").exists()
    assert git("rev-parse", f"{second}^", cwd=daemon_central.bare) == first
    subjects = daemon_central.log(branch_for(3))
    assert subjects.count("q-3: q3-left (coder)") == 1
    assert subjects.count("q-3: q3-right (coder)") == 1
    tree = git("ls-tree", "--name-only", branch_for(3), cwd=daemon_central.bare).split()
    assert {"left.py", "right.py"} <= set(tree)


def test_a_sibling_conflict_fails_the_agent_naming_the_sibling_commit(
    make_host: MakeHost, file_central: Central
) -> None:
    a, b = make_host("a", file_central), make_host("b", file_central)
    trees = {}
    for host, agent in ((a, "q4-one"), (b, "q4-two")):
        with host.active():
            trees[agent] = workspace_ensure(quantum_id=4)
            _write(trees[agent], "calc.py", f"# {agent}\n")
    with a.active():
        workspace_commit(workspace=trees["q4-one"], quantum_id=4, agent_id="q4-one", role="coder")
    with b.active(), pytest.raises(CentralConflict, match="q-4: q4-one"):
        workspace_commit(workspace=trees["q4-two"], quantum_id=4, agent_id="q4-two", role="coder")
    assert file_central.log(branch_for(4)).count("q-4: q4-two (coder)") == 0


def test_a_stale_execution_is_refused_and_leaves_nothing_on_the_branch(
    make_host: MakeHost, daemon_central: Central
) -> None:
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    with a.active():  # host A runs the agent, then is presumed dead
        old = Fence("q5-coder", note="attempt 1")
        tree_a = workspace_ready(
            workspace_prepare(quantum_id=5, fence=old), quantum_id=5, fence=old
        )
        _write(tree_a, "stale.py", "STALE = True\n")
    taken = _land(b, 5, "q5-coder", {"fresh.py": "FRESH = True\n"})  # host B takes it over
    with a.active():  # host A comes back and finishes
        with pytest.raises(StaleExecution, match="another execution holds the agent"):
            workspace_commit(
                workspace=tree_a, quantum_id=5, agent_id="q5-coder", role="coder", fence=old
            )
        assert git("rev-parse", "HEAD", cwd=tree_a) == taken  # its commit dropped locally too
    assert daemon_central.tip(branch_for(5)) == taken
    assert "stale.py" not in git("ls-tree", "--name-only", branch_for(5), cwd=daemon_central.bare)


def test_a_replayed_push_of_an_old_fence_is_refused(
    make_host: MakeHost, daemon_central: Central, tmp_path: Path
) -> None:
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    with a.active():
        fence = Fence("q6-coder")
        tree = workspace_ready(
            workspace_prepare(quantum_id=6, fence=fence), quantum_id=6, fence=fence
        )
        held = fence.sha
        _write(tree, "a.py", "A = 1\n")
        sha = workspace_commit(
            workspace=tree, quantum_id=6, agent_id="q6-coder", role="coder", fence=fence
        )
        assert fence.sha != held  # each push moves the fence on
        clone = repo_local()
        replay_fence = fence.sha
    newer = _land(b, 6, "q6-coder", {"b.py": "B = 2\n"})
    # Host A's last push, replayed as it was sent: what it expected is no longer there.
    proc = subprocess.run(
        [
            "git", "push", "--porcelain", "--atomic",
            f"--force-with-lease=refs/heads/{branch_for(6)}:{git('rev-parse', f'{sha}^', cwd=clone)}",
            f"--force-with-lease=refs/annihilation/fence/q6-coder:{held}",
            "origin", f"{sha}:refs/heads/{branch_for(6)}",
            f"{replay_fence}:refs/annihilation/fence/q6-coder",
        ],
        cwd=clone, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "[rejected] (stale info)" in proc.stdout
    assert daemon_central.tip(branch_for(6)) == newer


def test_local_mode_neither_clones_nor_pushes(hosts_settings: object, tmp_path: Path) -> None:
    repo = demo_repo_ensure(tmp_path / "repo")
    hosts_settings.ANNIHILATION_REPO = repo  # type: ignore[attr-defined]
    hosts_settings.PSYCHONAUTS_WORKTREES = tmp_path / "worktrees"  # type: ignore[attr-defined]
    fence = Fence("q8-coder")
    tree = workspace_ready(workspace_prepare(quantum_id=8, fence=fence), quantum_id=8, fence=fence)
    _write(tree, "x.py", "X = 1\n")
    sha = workspace_commit(workspace=tree, quantum_id=8, agent_id="q8-coder", role="coder")
    assert repo_local() == repo
    assert git("rev-parse", branch_for(8), cwd=repo) == sha
    assert not clone_path().exists()
    assert fence.sha == ""  # no fence taken


def test_a_worktree_with_commits_the_central_branch_lacks_is_reset_to_it(
    make_host: MakeHost, file_central: Central
) -> None:
    a, b = make_host("a", file_central), make_host("b", file_central)
    first = _land(a, 9, "q9-planner", {"PLAN.md": "plan\n"})
    with a.active():  # a commit that never got out (its push was refused)
        tree = workspace_ensure(quantum_id=9)
        _write(tree, "lost.py", "LOST = 1\n")
        git("add", "-A", cwd=tree)
        git("commit", "-q", "-m", "refused", cwd=tree)
        _write(tree, "sibling.txt", "a sibling's edit in progress\n")
    second = _land(b, 9, "q9-coder", {"code.py": "CODE = 1\n"})
    assert git("rev-parse", f"{second}^", cwd=file_central.bare) == first
    with a.active():
        tree = workspace_ensure(quantum_id=9)
        assert git("rev-parse", "HEAD", cwd=tree) == second
        assert not (tree / "lost.py").exists()
        assert (tree / "code.py").exists()
        assert (tree / "sibling.txt").read_text() == "a sibling's edit in progress\n"


def test_folders_a_stage_fetches_are_the_quantum_sandbox_user_s(
    make_host: MakeHost, file_central: Central, hosts_settings: object
) -> None:
    uid = sandbox_uid(11)
    if uid is None:
        pytest.skip("the sandbox users exist only for a root worker")
    hosts_settings.SANDBOX_MODE = "on"  # type: ignore[attr-defined]
    a, b = make_host("a", file_central), make_host("b", file_central)
    with b.active():  # host B ran the quantum's first stage: its worktree is there
        workspace_ensure(quantum_id=11)
    _land(a, 11, "q11-coder", {"notes.md": "n\n"})
    with a.active():
        tree = workspace_ensure(quantum_id=11)
        (tree / "notes").mkdir()
        _write(tree / "notes", "plan.md", "plan\n")
        workspace_commit(workspace=tree, quantum_id=11, agent_id="q11-coder", role="coder")
    with b.active():  # the next stage on host B: the new folder arrives by fetch
        tree = workspace_ensure(quantum_id=11)
        assert (tree / "notes" / "plan.md").exists()
        assert (tree / "notes").stat().st_uid == uid
        assert (tree / "notes" / "plan.md").stat().st_uid == uid


def test_agents_md_is_read_from_the_central_base_branch(
    make_host: MakeHost, file_central: Central, tmp_path: Path
) -> None:
    host = make_host("a", file_central)
    with host.active():
        workspace_ensure(quantum_id=14)  # the host's clone, from before the file
        assert agents_md() == ""
    work = tmp_path / "elsewhere"
    git("clone", "-q", file_central.url, str(work), cwd=tmp_path)
    _write(work, "AGENTS.md", "Run the tests before you commit.\n")
    git("add", "AGENTS.md", cwd=work)
    git("commit", "-q", "-m", "conventions", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    with host.active():
        workspace_ensure(quantum_id=13)  # the next stage's fetch brings the base
        assert agents_md() == "Run the tests before you commit."


def test_leftovers_in_the_way_of_the_central_tip_are_set_aside_not_worked_on(
    make_host: MakeHost, file_central: Central
) -> None:
    a, b = make_host("a", file_central), make_host("b", file_central)
    with a.active():  # an execution cut off on host A left its files uncommitted
        tree = workspace_ensure(quantum_id=15)
        (tree / "seen").mkdir()
        _write(tree / "seen", "coder.txt", "host A's stale attempt\n")
    tip = _land(b, 15, "q15-coder", {"seen/coder.txt": "host B's run\n"})  # it ran again there
    with a.active():
        tree = workspace_ensure(quantum_id=15)
        assert git("rev-parse", "HEAD", cwd=tree) == tip
        assert (tree / "seen" / "coder.txt").read_text() == "host B's run\n"
        assert git("status", "--porcelain", cwd=tree) == ""
        kept = git("stash", "list", cwd=tree)
        assert f"annihilation q-15: set aside to reach {tip[:10]}" in kept
