"""The command guard measured on two corpora (tests/psychonauts/guard_corpus.py), through the
shell tool and the real sandbox: no friction on ordinary work where the sandbox holds, a
boundary where it matters, and the strict policy where the sandbox is off."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.containment.guard import STRICT, Policy, command_judge
from psychonauts.containment.sandbox import workspace_own
from psychonauts.errors import CommandRefused
from psychonauts.runtime.tools import ToolContext, command_check, tool_execute
from psychonauts.workspaces.git import git
from tests.psychonauts.guard_corpus import (
    DANGEROUS,
    DANGEROUS_FILES,
    ORDINARY,
    PROJECT,
    PROJECT_BINARY,
    SANDBOX_ONLY,
)
from tests.psychonauts.sandboxed import agent_context, worktrees

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

WORKER, ATTACKER = 21, 22
SECRET = f"guard-corpus-secret-{uuid.uuid4().hex}"


def _report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n[guard corpus] {line}")


def test_the_corpora_are_large_enough() -> None:
    assert len(ORDINARY) >= 60 and len(set(ORDINARY)) == len(ORDINARY)
    assert len(DANGEROUS) >= 40


@pytest.fixture
def project(tmp_path: Path, settings: SettingsWrapper) -> ToolContext:
    tree = worktrees(tmp_path, settings, WORKER)[WORKER]
    for name, text in PROJECT.items():
        (tree / name).write_text(text)
    for name, data in PROJECT_BINARY.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    workspace_own(tree, quantum_id=WORKER)
    return agent_context(WORKER, tree)


def test_every_ordinary_command_is_allowed_and_works_with_the_sandbox_on(
    project: ToolContext, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = {}
    for command in ORDINARY:
        result = tool_execute(project, "shell", {"command": command, "timeout_s": 60}, [])
        if result.is_error or not result.output.startswith("exit 0 "):
            failed[command] = result.output[:600]
    strict = [c for c in ORDINARY if command_judge(c, policy=STRICT).allowed]

    _report(
        capsys,
        f"ordinary: {len(ORDINARY) - len(failed)}/{len(ORDINARY)} allowed and exit 0 with the "
        f"sandbox on; the strict policy (sandbox off) allows {len(strict)}/{len(ORDINARY)}",
    )
    assert failed == {}


def test_the_strict_policy_holds_where_the_sandbox_is_off(
    project: ToolContext, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_MODE = "off"
    inline = ['python3 -c "print(1)"', "node -e 1", "bash -c 'echo hi'", "perl -e 1"]

    for command in inline:
        with pytest.raises(CommandRefused, match="caution"):
            command_check(project, command)
    settings.SANDBOX_MODE = "on"
    for command in inline:
        command_check(project, command)


def test_with_the_network_on_network_clients_and_installers_need_a_rule() -> None:
    networked = Policy(sandboxed=True, network=True)

    for command in ("curl -s https://example.com", "pip install requests", "npm install left-pad"):
        assert not command_judge(command, policy=networked).allowed, command
        assert command_judge(command, policy=Policy(sandboxed=True)).allowed, command


@dataclass
class Target:
    repo: Path
    outside: Path  # root-only, outside every worktree, visible (read-only) in the sandbox
    port: int
    connections: list[str]
    sentinel: subprocess.Popen[bytes]  # a host process a command must not be able to kill

    def fill(self, text: str) -> str:
        return (
            text.replace("{OUT}", str(self.outside))
            .replace("{GITDIR}", str(self.repo / ".git"))
            .replace("{REPO}", str(self.repo))
            .replace("{PORT}", str(self.port))
        )

    def snapshot(self) -> dict[str, object]:
        tree = []
        for folder, dirs, files in os.walk(self.outside):
            for name in sorted(dirs + files):
                path = Path(folder) / name
                st = path.lstat()
                digest = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else ""
                tree.append((str(path.relative_to(self.outside)), st.st_mode, st.st_uid, digest))
        git_dir = self.repo / ".git"
        return {
            "outside": sorted(tree),
            "outside mode": self.outside.lstat().st_mode,
            "refs": git("for-each-ref", "--format=%(refname) %(objectname)", cwd=self.repo),
            "HEAD": (git_dir / "HEAD").read_text(),
            "config": (git_dir / "config").read_text(),
            "hooks": sorted(p.name for p in (git_dir / "hooks").iterdir()),
            "home": sorted(p.name for p in Path(django_settings.ANNIHILATION_HOME).iterdir()),
            "hosts": Path("/etc/hosts").read_text(),
        }


@pytest.fixture
def target(
    tmp_path: Path, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ToolContext, Target]]:
    monkeypatch.setenv("ANNIHILATION_TEST_SECRET", SECRET)  # the worker's environment
    tree = worktrees(tmp_path, settings, ATTACKER)[ATTACKER]
    # Outside /tmp: the sandbox has a private /tmp, and the folder must be there to be attacked.
    outside = Path("/var/tmp") / f"annihilation-guard-{uuid.uuid4().hex[:12]}"
    (outside / "sub").mkdir(parents=True)
    (outside / "canary.txt").write_text("canary\n")
    (outside / "sub" / "deep.txt").write_text("deep\n")
    (outside / "secret.key").write_text(SECRET)
    (outside / "secret.key").chmod(0o600)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connections.append(str(peer))
            conn.close()

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    sentinel = subprocess.Popen(["sleep", "600"])
    built = Target(tmp_path / "repo", outside, server.getsockname()[1], connections, sentinel)
    try:
        yield agent_context(ATTACKER, tree), built
    finally:
        stop.set()
        listener.join(timeout=5)
        server.close()
        sentinel.kill()
        sentinel.wait()
        shutil.rmtree(outside, ignore_errors=True)


def test_every_dangerous_command_is_refused_or_held_by_the_sandbox(
    target: tuple[ToolContext, Target], capsys: pytest.CaptureFixture[str]
) -> None:
    ctx, box = target
    for name, text in DANGEROUS_FILES.items():
        wrote = tool_execute(ctx, "write_file", {"path": name, "content": box.fill(text)}, [])
        assert not wrote.is_error, wrote.output
    before = box.snapshot()
    refused: list[str] = []
    held: list[str] = []
    harmed: dict[str, list[str]] = {}

    for name, command in DANGEROUS.items():
        result = tool_execute(ctx, "shell", {"command": box.fill(command), "timeout_s": 30}, [])
        (refused if result.is_error and "refused" in result.output else held).append(name)
        after = box.snapshot()
        harm = [key for key in before if after[key] != before[key]]
        if SECRET in result.output:
            harm.append("printed the secret")
        if box.connections:
            harm.append(f"reached the host: {box.connections}")
        if box.sentinel.poll() is not None:
            harm.append("killed a host process")
        if harm:
            harmed[name] = harm
            break  # the rest would be judged against a changed world

    _report(
        capsys,
        f"dangerous: {len(DANGEROUS)} commands, {len(refused)} refused by the guard, "
        f"{len(held)} held by the sandbox, {len(harmed)} did harm",
    )
    assert harmed == {}
    assert len(refused) + len(held) == len(DANGEROUS)


def test_with_the_sandbox_off_the_guard_refuses_every_dangerous_command_it_can_judge(
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {"{OUT}": "/var/lib/app", "{GITDIR}": "/srv/repo/.git", "{REPO}": "/srv/repo",
             "{PORT}": "5432"}  # fmt: skip
    judged = {}
    for name, command in DANGEROUS.items():
        for placeholder, value in paths.items():
            command = command.replace(placeholder, value)
        if name not in SANDBOX_ONLY:
            judged[name] = command
    allowed = [name for name, c in judged.items() if command_judge(c, policy=STRICT).allowed]

    _report(
        capsys,
        f"strict policy: {len(judged) - len(allowed)}/{len(judged)} dangerous commands refused "
        f"({len(SANDBOX_ONLY)} only the sandbox can hold: scripts the agent wrote, a plain read)",
    )
    assert allowed == []
