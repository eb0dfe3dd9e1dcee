"""The file tools against a sibling that swaps a folder for a link while they work.

A sibling agent of the same quantum (fan-out, spawn) shares the worktree and can replace a
folder by a link to a root-only folder at any moment. The runtime runs the file tools as the
worker (root), outside the sandbox: a tool that checks a path and then uses the path string again
would act on the root-only folder. Instead of waiting for timing luck, each test replays the
tool once per file-system call it makes, swapping the folder just before that call: every gap
between a check and a use is tried.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.containment.sandbox import sandbox_uid, workspace_own
from psychonauts.runtime.tools import ToolContext, ToolResult, tool_execute

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(os.geteuid() != 0, reason="the worker hands files to sandbox uids as root"),
]

QUANTUM = 7
SECRET = f"root-only-{uuid.uuid4().hex}"
MARKER = f"outside-marker-{uuid.uuid4().hex[:8]}"
# The calls a file tool can make on a path or a descriptor; a swap lands just before one of them.
_CALLS = ("open", "stat", "lstat", "fstat", "lchown", "chown", "fchown", "scandir", "listdir",
          "mkdir", "readlink", "access", "utime", "chmod", "fchmod")  # fmt: skip


@dataclass
class Scene:
    worktree: Path
    outside: Path  # root-only: 0700, with a 0600 file of the same name as the worktree's

    @property
    def folder(self) -> Path:
        return self.worktree / "d"

    def reset(self) -> None:
        """The worktree's folder `d` as a real folder again, and the outside as it was."""
        if self.folder.is_symlink():
            self.folder.unlink()
        moved = self.worktree / "d.moved"
        if moved.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
            moved.rename(self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir()
        (self.folder / "f").write_text("mine\n")
        uid = sandbox_uid(QUANTUM)
        assert uid is not None
        for path in (self.folder, self.folder / "f"):
            os.lchown(path, uid, uid)
        shutil.rmtree(self.outside, ignore_errors=True)
        self.outside.mkdir(mode=0o700)
        (self.outside / "f").write_text(SECRET)
        (self.outside / MARKER).write_text(SECRET)
        for path in (self.outside / "f", self.outside / MARKER):
            os.chown(path, 0, 0)
            path.chmod(0o600)

    def swap(self) -> None:
        """What the sibling does: the folder becomes a link to the root-only folder."""
        self.folder.rename(self.worktree / "d.moved")
        self.folder.symlink_to(self.outside)

    def assert_outside_untouched(self, result: ToolResult) -> None:
        assert sorted(p.name for p in self.outside.iterdir()) == sorted(["f", MARKER])
        for path in (self.outside, self.outside / "f", self.outside / MARKER):
            st = os.lstat(path)
            assert (st.st_uid, st.st_gid) == (0, 0), f"{path} was handed to uid {st.st_uid}"
        assert stat.S_IMODE(os.lstat(self.outside / "f").st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(self.outside).st_mode) == 0o700
        assert (self.outside / "f").read_text() == SECRET
        assert SECRET not in result.output and MARKER not in result.output, result.output


@pytest.fixture
def scene(tmp_path: Path, settings: SettingsWrapper) -> Iterator[Scene]:
    settings.SANDBOX_MODE = "on"
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    built = Scene(worktree, tmp_path / "root-only")
    built.reset()
    yield built


class Swapper:
    """Wraps the os module's path and descriptor calls: on the n-th call of the tool's thread,
    the sibling swaps the folder first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, scene: Scene) -> None:
        self.scene = scene
        self.thread = threading.get_ident()
        self.count = 0
        self.at = 0  # 0: count only
        for name in _CALLS:
            real = getattr(os, name, None)
            if real is not None:
                monkeypatch.setattr(os, name, self._wrap(real))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread:
                self.count += 1
                if self.count == self.at:
                    self.scene.swap()
            return real(*args, **kwargs)

        return call

    def replay(self, run: Callable[[], ToolResult]) -> Iterator[ToolResult]:
        """The tool once without a swap, then once per call it made, swapped before that call."""
        self.count, self.at = 0, 0
        yield run()
        calls = self.count
        assert calls > 0
        for at in range(1, calls + 2):
            self.scene.reset()
            self.count, self.at = 0, at
            yield run()
            self.at = 0


def _ctx(scene: Scene) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id=f"{QUANTUM}_s0_coder", attempt=1, quantum_id=QUANTUM,
        role="coder", depth=0, workspace=scene.worktree, shared=False,
    )  # fmt: skip


CALLS = {
    "write_file over a file": ("write_file", {"path": "d/f", "content": "x"}),
    "write_file in a new folder": ("write_file", {"path": "d/new/g", "content": "x"}),
    "edit_file": ("edit_file", {"path": "d/f", "old": "mine", "new": "yours"}),
    "read_file": ("read_file", {"path": "d/f"}),
    "list_dir": ("list_dir", {"path": "d"}),
    "glob a folder": ("glob", {"pattern": "d/*"}),
    "glob everything": ("glob", {"pattern": "**"}),
    "grep": ("grep", {"pattern": "root-only|mine"}),
    "grep in a folder": ("grep", {"pattern": "root-only|mine", "glob": "d/*"}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_folder_swapped_for_a_link_mid_call_never_exposes_what_it_leads_to(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    tool, args = CALLS[name]
    swapper = Swapper(monkeypatch, scene)
    ctx = _ctx(scene)
    tried = 0

    for result in swapper.replay(lambda: tool_execute(ctx, tool, args, [])):
        tried += 1
        scene.assert_outside_untouched(result)

    assert tried > 2


def test_a_file_written_beneath_the_worktree_belongs_to_the_quantum_and_nothing_else_changes(
    scene: Scene,
) -> None:
    ctx = _ctx(scene)
    uid = sandbox_uid(QUANTUM)

    wrote = tool_execute(ctx, "write_file", {"path": "d/new/deeper/g.txt", "content": "x"}, [])

    assert not wrote.is_error, wrote.output
    for path in ("d/new", "d/new/deeper", "d/new/deeper/g.txt"):
        assert os.lstat(scene.worktree / path).st_uid == uid, path
    assert (scene.worktree / "d/new/deeper/g.txt").read_text() == "x"


def test_a_hard_link_to_a_root_only_file_is_neither_written_nor_handed_over(
    scene: Scene,
) -> None:
    os.link(scene.outside / "f", scene.folder / "linked")
    ctx = _ctx(scene)

    write = tool_execute(ctx, "write_file", {"path": "d/linked", "content": "x"}, [])
    read = tool_execute(ctx, "read_file", {"path": "d/linked"}, [])
    grep = tool_execute(ctx, "grep", {"pattern": "root-only"}, [])

    os.link(scene.folder / "f", scene.folder / "second-name")
    own = tool_execute(ctx, "read_file", {"path": "d/second-name"}, [])

    assert write.is_error and "hard link" in write.output, write.output
    assert read.is_error and "hard link" in read.output, read.output
    for result in (write, read, grep):
        scene.assert_outside_untouched(result)
    assert own.output == "mine\n"  # a second name of the quantum's own file is no escape


def test_a_sibling_swapping_in_a_loop_never_wins(scene: Scene) -> None:
    """The same race by timing: a thread swaps the folder back and forth while the tools run."""
    ctx = _ctx(scene)
    stop = threading.Event()
    swaps = 0

    def sibling() -> None:
        nonlocal swaps
        moved, link = scene.worktree / "d.moved", scene.worktree / "d.link"
        link.symlink_to(scene.outside)
        while not stop.is_set():
            scene.folder.rename(moved)
            try:
                link.rename(scene.folder)
                scene.folder.rename(link)
            except OSError:
                pass  # a write_file made the folder again while it was away
            while True:
                try:
                    moved.rename(scene.folder)
                    break
                except OSError:
                    shutil.rmtree(scene.folder, ignore_errors=True)
            swaps += 1

    thread = threading.Thread(target=sibling, daemon=True)
    thread.start()
    try:
        for _ in range(150):
            for tool, args in CALLS.values():
                if tool != "edit_file":
                    scene.assert_outside_untouched(tool_execute(ctx, tool, args, []))
    finally:
        stop.set()
        thread.join(timeout=10)
    assert swaps > 0


def test_a_folder_link_is_followed_only_while_it_stays_inside_the_worktree(scene: Scene) -> None:
    (scene.worktree / ".git").mkdir()
    (scene.worktree / ".git" / "config").write_text("[core]\n")
    (scene.worktree / "inside").symlink_to("d")
    (scene.worktree / "absolute").symlink_to(scene.folder)
    (scene.worktree / "to-git").symlink_to(".git")
    (scene.worktree / "up").symlink_to("d/../..")
    (scene.worktree / "loop").symlink_to("loop")
    ctx = _ctx(scene)

    followed = [
        tool_execute(ctx, "read_file", {"path": "inside/f"}, []),
        tool_execute(ctx, "read_file", {"path": "absolute/f"}, []),
        tool_execute(ctx, "list_dir", {"path": "inside"}, []),
    ]
    refused = [
        tool_execute(ctx, "read_file", {"path": "to-git/config"}, []),
        tool_execute(ctx, "write_file", {"path": "to-git/hooks/x", "content": "x"}, []),
        tool_execute(ctx, "read_file", {"path": "up/root-only/f"}, []),
        tool_execute(ctx, "list_dir", {"path": "loop"}, []),
    ]

    assert [r.output for r in followed] == ["mine\n", "mine\n", "f"]
    assert all(r.is_error and "refused" in r.output for r in refused), refused
    assert not (scene.worktree / ".git" / "hooks").exists()


def test_handing_a_worktree_to_its_quantum_never_hands_over_what_a_swapped_link_leads_to(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    (scene.folder / "inner").mkdir()
    (scene.folder / "inner" / "g").write_text("mine\n")
    swapper = Swapper(monkeypatch, scene)

    def own() -> ToolResult:
        workspace_own(scene.worktree, quantum_id=QUANTUM)
        return ToolResult("", False)

    for result in swapper.replay(own):
        scene.assert_outside_untouched(result)
    scene.reset()
    (scene.folder / "inner").mkdir()
    (scene.folder / "inner" / "g").write_text("mine\n")
    (scene.worktree / "link").symlink_to(scene.outside / "f")
    own()
    for path in ("d", "d/inner", "d/inner/g", "link"):
        assert os.lstat(scene.worktree / path).st_uid == sandbox_uid(QUANTUM), path
    scene.assert_outside_untouched(ToolResult("", False))


def test_two_names_of_one_file_share_its_lease_in_the_shared_tree(scene: Scene) -> None:
    (scene.worktree / "alias").symlink_to("d")
    ctx, other = _ctx(scene), _ctx(scene)
    other.agent_id = f"{QUANTUM}_s0_reviewer"
    ctx.shared = other.shared = True

    leased = tool_execute(ctx, "lease_acquire", {"path": "d/f"}, [])
    through_alias = tool_execute(other, "write_file", {"path": "alias/f", "content": "x"}, [])
    alias_lease = tool_execute(other, "lease_acquire", {"path": "./alias/f"}, [])

    assert not leased.is_error, leased.output
    assert through_alias.is_error and "no exclusive lease" in through_alias.output
    assert alias_lease.is_error and f"leased by {QUANTUM}_s0_coder#1" in alias_lease.output
    assert (scene.folder / "f").read_text() == "mine\n"
