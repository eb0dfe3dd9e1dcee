"""The agent sandbox against a hostile agent: real bubblewrap, real git, real services.

Every escape runs straight in the sandbox, as if the guard had let it through, and the test
asserts that nothing outside the worktree changed: files and folders next to it, the
repository's refs, config and hooks, another quantum's worktree and branch, the host's /tmp and
/dev/shm, and this process. Commands that read look for what they must not find.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.containment.guard import command_judge
from psychonauts.containment.sandbox import (
    SandboxResult,
    installation_register,
    sandbox_run,
    sandbox_status,
    sandbox_uid,
    workspace_own,
)
from psychonauts.containment.traumas import trauma_pattern, traumas_for
from psychonauts.models import CommandTrauma, Role, TraumaSource
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.runs import agent_run_create
from psychonauts.runtime.tools import ToolContext, tool_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.services import quantum_create

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    # A root worker's sandbox uids are rows of the database.
    pytest.mark.django_db,
]

QUANTUM, OTHER = 7, 8
SECRET = f"worker-secret-{uuid.uuid4().hex}"


@dataclass
class Box:
    repo: Path
    worktree: Path
    other: Path  # another quantum's worktree
    outside: Path  # a folder next to the worktrees, with files in it
    marker: str  # a unique name for files an escape would create in /tmp and /dev/shm

    def run(self, command: str, timeout_s: float = 20) -> SandboxResult:
        return sandbox_run(
            self.fill(command),
            workspace=self.worktree,
            quantum_id=QUANTUM,
            timeout_s=timeout_s,
        )

    def fill(self, command: str) -> str:
        return (
            command.replace("{OUT}", str(self.outside))
            .replace("{REPO}", str(self.repo))
            .replace("{OTHER}", str(self.other))
            .replace("{OTHER_BRANCH}", branch_for(OTHER))
            .replace("{GITDIR}", str(self.repo / ".git"))
            .replace("{MARK}", self.marker)
            .replace("{HOME}", str(django_settings.ANNIHILATION_HOME))
            .replace("{PG}", str(_port(django_settings.DATABASES["default"].get("PORT"), 5432)))
            .replace("{REDIS}", str(_port(django_settings.REDIS_URL.rsplit(":", 1)[-1], 6379)))
        )


def _port(value: object, default: int) -> int:
    digits = "".join(ch for ch in str(value or "").split("/")[0] if ch.isdigit())
    return int(digits) if digits else default


def _tree(root: Path) -> list[tuple[str, int, int, str]]:
    """Every entry below `root`: path, mode, owner and content hash (links by their target)."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            st = path.lstat()
            if path.is_symlink():
                digest = "->" + str(path.readlink())
            elif path.is_file():
                digest = hashlib.sha1(path.read_bytes()).hexdigest()
            else:
                digest = ""
            found.append((str(path.relative_to(root)), st.st_mode, st.st_uid, digest))
    return sorted(found)


def _snapshot(box: Box) -> dict[str, object]:
    git_dir = box.repo / ".git"
    return {
        "outside": _tree(box.outside),
        "repo files": _tree(box.repo / "src"),
        "refs": git("for-each-ref", "--format=%(refname) %(objectname)", cwd=box.repo),
        "config": (git_dir / "config").read_text(),
        "hooks": _tree(git_dir / "hooks"),
        "worktree records": _tree(git_dir / "worktrees"),
        "other worktree": _tree(box.other),
        "pointer": (box.worktree / ".git").read_text(),
        "tmp": sorted(p.name for p in Path("/tmp").iterdir() if box.marker in p.name),
        "shm": sorted(p.name for p in Path("/dev/shm").iterdir() if box.marker in p.name),
        "home": sorted(p.name for p in Path(django_settings.ANNIHILATION_HOME).iterdir()),
    }


@pytest.fixture
def box(
    tmp_path: Path, settings: SettingsWrapper, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Box]:
    monkeypatch.setenv("ANNIHILATION_TEST_SECRET", SECRET)  # the worker's environment
    settings.ANNIHILATION_HOME = tmp_path / "home"
    settings.PSYCHONAUTS_WORKTREES = tmp_path / "home" / "worktrees"
    settings.PSYCHONAUTS_WORKSPACE_MODE = "worktree"
    settings.SANDBOX_MODE = "on"
    settings.SANDBOX_NETWORK = False
    settings.SANDBOX_PROCESSES = 64
    settings.SANDBOX_MEMORY_BYTES = 512 * 2**20
    settings.SANDBOX_OUTPUT_BYTES = 256 * 2**10
    settings.SANDBOX_REGISTRY = tmp_path / "installations"
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "app.py").write_text("print('hello')\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init", cwd=repo)
    settings.ANNIHILATION_REPO = repo
    assert sandbox_status().state == "on", sandbox_status().detail
    other = workspace_ensure(quantum_id=OTHER)
    (other / "theirs.txt").write_text("another quantum's unmerged work\n")
    workspace_commit(workspace=other, quantum_id=OTHER, agent_id="other", role="coder")
    worktree = workspace_ensure(quantum_id=QUANTUM)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "existing.txt").write_text("a b c\n")
    (outside / "sub" / "deep.txt").write_text("deep\n")
    for readable in (Path(settings.ANNIHILATION_HOME) / "secrets.env", other / "secrets.env"):
        readable.write_text(SECRET)
        readable.chmod(0o644)
    secret = outside / "private.key"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    yield Box(repo, worktree, other, outside, f"escape-{uuid.uuid4().hex[:12]}")
    for folder in (Path("/tmp"), Path("/dev/shm")):
        for leftover in folder.glob("*escape-*"):
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink()


# Escapes that try to change something outside the worktree. Each runs as a whole; some
# fail at their first step, which is the point.
WRITE_ESCAPES = {
    "python writes a file": "python3 -c \"open('{OUT}/p', 'w').write('x')\"",
    "python rewrites a file": "python3 -c \"open('{OUT}/existing.txt', 'w').write('x')\"",
    "python os.remove": "python3 -c \"import os; os.remove('{OUT}/existing.txt')\"",
    "perl writes a file": 'perl -e \'open(F, ">{OUT}/p"); print F "x"\'',
    "redirect >": "echo x > {OUT}/p",
    "redirect >>": "echo x >> {OUT}/existing.txt",
    "redirect 2>": "echo x 2>{OUT}/p",
    "redirect 1>": "echo x 1>{OUT}/p",
    "redirect &>": "echo x &> {OUT}/p",
    "redirect through a relative path": "echo x > ../../outside/p",
    "git log --output": "git log --output={OUT}/p",
    "git diff --output": "echo y >> a.txt; git diff --output={OUT}/p",
    "sed -i outside": "sed -i 's/a/z/' {OUT}/existing.txt",
    "sort -o outside": "sort -o {OUT}/existing.txt /etc/hostname",
    "cp --target-directory": "echo x > a.txt; cp a.txt --target-directory={OUT}",
    "cp -t": "echo x > a.txt; cp -t {OUT} a.txt",
    "find -delete": "find {OUT} -delete",
    "rm -rf": "rm -rf {OUT}",
    "mv a file out of it": "mv {OUT}/existing.txt stolen.txt",
    "truncate": "truncate -s 0 {OUT}/existing.txt",
    "dd over a file": "dd if=/dev/zero of={OUT}/existing.txt bs=1 count=3",
    "chmod": "chmod 777 {OUT} {OUT}/existing.txt",
    "touch and mkdir": "touch {OUT}/p; mkdir {OUT}/d",
    "tee": "echo x | tee {OUT}/p",
    "a link in the worktree written through": "ln -s {OUT}/existing.txt link && echo x > link",
    "GIT_EDITOR runs a program": "GIT_EDITOR='touch {OUT}/p' git commit --allow-empty",
    "core.pager runs a program": "git -c core.pager='touch {OUT}/p' -p log",
    "GIT_EXTERNAL_DIFF runs a program": (
        "echo y >> a.txt; git add -N a.txt; GIT_EXTERNAL_DIFF='touch {OUT}/p' git diff --ext-diff"
    ),
    "git grep --open-files-in-pager": "git grep --open-files-in-pager='touch {OUT}/p' hello",
    "git branch -D another quantum's branch": "git branch -D {OTHER_BRANCH}",
    "git branch -f another quantum's branch": "git branch -f {OTHER_BRANCH} main",
    "git update-ref": "git update-ref refs/heads/{OTHER_BRANCH} refs/heads/main",
    "git push to the repository": "git push -f {REPO} HEAD:{OTHER_BRANCH}",
    "git tag and branch": "git tag evil; git branch evil",
    "git config a hook path": "git config core.hooksPath {OUT}",
    "a hook planted in the git folder": (
        "printf '#!/bin/sh\\ntouch {OUT}/p\\n' > {GITDIR}/hooks/post-commit"
    ),
    "the worktree's .git pointer rewritten": "echo 'gitdir: {GITDIR}' > .git",
    "the worktree's git record rewritten": "echo main > {GITDIR}/worktrees/q-7/HEAD",
    "another quantum's worktree": "echo x > {OTHER}/theirs.txt; rm -f {OTHER}/theirs.txt",
    "the repository's files": "echo x > {REPO}/src/app.py",
    "the host's /tmp": "echo x > /tmp/{MARK}",
    "the host's /dev/shm": "echo x > /dev/shm/{MARK}",
    "a new mount namespace": "unshare -rm sh -c 'mount -t tmpfs none {OUT} && touch {OUT}/p'",
    "kill every process it can": "kill -9 -1; true",
    "sudo and su": "sudo touch {OUT}/p; su -c 'touch {OUT}/p'",
    "a daemon that outlives the command": "(setsid sh -c 'sleep 2; touch {OUT}/p' &); true",
}


@pytest.mark.parametrize("name", list(WRITE_ESCAPES))
def test_it_leaves_everything_outside_the_worktree_as_it_was(box: Box, name: str) -> None:
    before = _snapshot(box)

    result = box.run(WRITE_ESCAPES[name])
    if "daemon" in name:
        time.sleep(2.5)

    assert _snapshot(box) == before, result.output
    assert result.sandboxed


READ_ESCAPES = {
    "the parent's environment": "cat /proc/$PPID/environ; cat /proc/1/environ; cat /proc/self/environ",
    "every process's environment": "cat /proc/*/environ",
    "a private file of the worker's user": "cat {OUT}/private.key",
    "a readable file in the data folder": "cat {HOME}/secrets.env",
    "a readable file in another quantum's worktree": "cat {OTHER}/secrets.env",
    "the shadow file": "cat /etc/shadow",
}


@pytest.mark.parametrize("name", list(READ_ESCAPES))
def test_it_shows_no_secret_of_the_worker(box: Box, name: str) -> None:
    if ("private" in name or "shadow" in name) and sandbox_uid(QUANTUM) is None:
        pytest.skip("the worker runs as an ordinary user: the sandbox runs as that user")

    result = box.run(READ_ESCAPES[name])

    assert SECRET not in result.output
    assert "DATABASE_URL" not in result.output and "root:" not in result.output


def test_it_sees_only_its_own_processes(box: Box) -> None:
    result = box.run("ps -eo pid=,args=")

    processes = result.stdout.strip().splitlines()
    assert len(processes) <= 4, processes  # bubblewrap's init, setpriv's bash, ps
    assert not any("celery" in p or "py.test" in p or "bin/pytest" in p for p in processes)


def test_it_has_only_the_environment_a_command_needs(box: Box) -> None:
    result = box.run("env; tr '\\0' '\\n' < /proc/1/environ")

    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert names <= {
        "PATH", "HOME", "TMPDIR", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD",
        "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0",
    }  # fmt: skip


@pytest.mark.parametrize("service", ["{PG}", "{REDIS}"])
def test_it_cannot_reach_the_local_postgres_or_redis(box: Box, service: str) -> None:
    probe = (
        'python3 -c "import socket; s = socket.socket(); s.settimeout(2); '
        f"s.connect(('127.0.0.1', {service})); print('CONNECTED')\""
    )

    result = box.run(probe)

    assert "CONNECTED" not in result.output
    assert "refused" in result.output.lower() or "unreachable" in result.output.lower()


def test_it_cannot_reach_a_server_on_the_host(box: Box) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"REACHED")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        result = box.run(
            'python3 -c "import urllib.request; '
            f"print(urllib.request.urlopen('http://127.0.0.1:{port}', timeout=2).read())\""
        )
    finally:
        server.shutdown()
        server.server_close()

    assert "REACHED" not in result.output


def test_it_reaches_no_unix_socket_of_the_host(box: Box) -> None:
    paths = [box.outside / "service.sock", Path("/tmp") / f"{box.marker}.sock"]
    servers = []
    for path in paths:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(1)
        servers.append(server)
    try:
        result = box.run(
            'python3 -c "import socket, sys\n'
            "for path in sys.argv[1:]:\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(path); print('CONNECTED', path)\n"
            "    except OSError as e:\n"
            '        print(e)\n" ' + " ".join(str(p) for p in paths)
        )
    finally:
        for server in servers:
            server.close()
        for path in paths:
            path.unlink()

    assert "CONNECTED" not in result.output
    assert result.output.count("No such file") + result.output.count("denied") == 2, result.output


def test_a_fork_bomb_is_bounded_by_the_process_limit(box: Box) -> None:
    started = time.monotonic()

    result = box.run(":(){ :|:& };:; sleep 1; echo survived", timeout_s=10)

    assert time.monotonic() - started < 15
    assert result.sandboxed
    uid = sandbox_uid(QUANTUM)
    if uid is not None:
        time.sleep(0.2)
        left = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True)
        assert left.stdout == "", "processes of the sandbox outlived it"
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


def test_a_memory_hog_is_bounded_by_the_memory_limit(box: Box) -> None:
    result = box.run("python3 -c \"x = bytearray(4 * 2**30); print('ALLOCATED')\"")

    assert "ALLOCATED" not in result.output
    assert "MemoryError" in result.output


def test_a_flood_of_output_is_cut_and_the_command_killed(box: Box) -> None:
    result = box.run("yes flood")

    assert result.stopped == "output"
    assert len(result.stdout) <= django_settings.SANDBOX_OUTPUT_BYTES


def test_a_command_past_its_wall_time_is_killed_with_its_children(box: Box) -> None:
    result = box.run("sleep 30 & sleep 30", timeout_s=1)

    assert result.stopped == "timeout"
    uid = sandbox_uid(QUANTUM)
    if uid is not None:
        time.sleep(0.2)
        assert subprocess.run(["pgrep", "-u", str(uid)], capture_output=True).stdout == b""


def test_a_legitimate_command_works_and_its_work_is_committed(box: Box) -> None:
    result = box.run(
        "mkdir -p pkg && printf 'def add(a, b):\\n    return a + b\\n' > pkg/calc.py && "
        "printf 'from pkg.calc import add\\nassert add(2, 3) == 5\\nprint(\"tests ok\")\\n' "
        "> test_calc.py && touch pkg/__init__.py && python3 test_calc.py && "
        "echo scratch > /tmp/scratch && cat /tmp/scratch && git status --short && git log --oneline"
    )

    assert result.returncode == 0, result.output
    assert "tests ok" in result.stdout and "scratch" in result.stdout
    assert "?? pkg/" in result.stdout and "init" in result.stdout
    sha = workspace_commit(workspace=box.worktree, quantum_id=QUANTUM, agent_id="a", role="coder")
    files = git("show", "--name-only", "--format=", sha, cwd=box.repo).split()
    assert {"pkg/calc.py", "pkg/__init__.py", "test_calc.py"} <= set(files)


def test_it_runs_as_an_unprivileged_uid_when_the_worker_is_root(box: Box) -> None:
    if os.geteuid() != 0:
        pytest.skip("the worker is not root")

    result = box.run("id -u; cat /proc/self/status | grep -i capeff")

    lines = result.stdout.split()
    assert lines[0] == str(sandbox_uid(QUANTUM)) != "0"
    assert result.stdout.strip().endswith("0000000000000000")


def test_it_can_allow_the_network_by_setting(box: Box, settings: SettingsWrapper) -> None:
    settings.SANDBOX_NETWORK = True
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        port = server.getsockname()[1]
        result = box.run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
            "print('CONNECTED')\""
        )
    finally:
        server.close()

    assert "CONNECTED" in result.stdout


def _ctx(box: Box) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id=f"{QUANTUM}_s0_coder", attempt=1, quantum_id=QUANTUM,
        role="coder", depth=0, workspace=box.worktree, shared=False,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_refused_dangerous_command_runs_nothing_and_records_a_trauma(box: Box) -> None:
    before = _snapshot(box)

    result = tool_execute(_ctx(box), "shell", {"command": box.fill("echo x 2>/etc/{MARK}")}, [])

    assert result.is_error and "refused (danger)" in result.output
    assert _snapshot(box) == before
    trauma = CommandTrauma.objects.get(source=TraumaSource.GUARD)
    assert trauma.agent_id == f"{QUANTUM}_s0_coder" and "writes outside" in trauma.reason
    assert trauma.quantum_id == QUANTUM
    assert command_judge(box.fill("echo x 2>/etc/{MARK}"), traumas=[(trauma.pattern, "")]).tier


@pytest.mark.django_db
def test_a_command_that_hits_a_sandbox_boundary_fails_there_and_plants_no_trauma(
    box: Box,
) -> None:
    (box.worktree / "sneaky.py").write_text("open('/usr/annihilation-escape', 'w').write('x')\n")
    before = _snapshot(box)

    result = tool_execute(_ctx(box), "shell", {"command": "python3 sneaky.py"}, [])
    again = tool_execute(_ctx(box), "shell", {"command": "python3 sneaky.py"}, [])

    # What a command prints is the agent's to choose: it is no evidence of an incident.
    assert "Read-only file system" in result.output and not result.is_error
    assert _snapshot(box) == before and not Path("/usr/annihilation-escape").exists()
    assert not CommandTrauma.objects.exists()
    assert not again.is_error and "Read-only file system" in again.output


@pytest.mark.django_db
def test_file_tools_never_follow_a_link_out_of_the_worktree(box: Box) -> None:
    (box.worktree / "passwd").symlink_to("/etc/passwd")
    (box.worktree / "out").symlink_to(box.outside)
    (box.worktree / "inner.txt").symlink_to("a-target.txt")
    (box.worktree / "a-target.txt").write_text("inside\n")
    ctx = _ctx(box)
    before = _snapshot(box)

    grep = tool_execute(ctx, "grep", {"pattern": "root|a b c|inside"}, [])
    reads = [
        tool_execute(ctx, "read_file", {"path": p}, []) for p in ("passwd", "out/existing.txt")
    ]
    writes = [
        tool_execute(ctx, "write_file", {"path": p, "content": "x"}, [])
        for p in ("passwd", "out/existing.txt", "out/new.txt")
    ]
    edit = tool_execute(ctx, "edit_file", {"path": "out/existing.txt", "old": "a", "new": "z"}, [])
    glob = tool_execute(ctx, "glob", {"pattern": "**"}, [])

    assert "root:" not in grep.output and "a b c" not in grep.output
    assert "a-target.txt:1: inside" in grep.output
    assert all(r.is_error for r in [*reads, *writes, edit]), [r.output for r in reads + writes]
    assert "existing.txt" not in glob.output
    assert _snapshot(box) == before
    assert Path("/etc/passwd").read_text().startswith("root:")


@pytest.mark.django_db
def test_a_catastrophic_regular_expression_is_bounded_in_time(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.PSYCHONAUTS_GREP_TIMEOUT_S = 0.5
    (box.worktree / "a.txt").write_text("a" * 40 + "!\n")
    started = time.monotonic()

    result = tool_execute(_ctx(box), "grep", {"pattern": "(a|aa)+$"}, [])

    assert time.monotonic() - started < 5
    assert result.is_error and "longer than 0.5s" in result.output


@pytest.mark.django_db
def test_files_the_runtime_writes_belong_to_the_quantum_s_sandbox_user(box: Box) -> None:
    ctx = _ctx(box)
    tool_execute(ctx, "write_file", {"path": "new/deep/file.txt", "content": "one\n"}, [])

    result = tool_execute(
        ctx, "shell", {"command": "echo two >> new/deep/file.txt && cat new/deep/file.txt"}, []
    )

    assert not result.is_error and "one\ntwo" in result.output, result.output


@pytest.mark.django_db
def test_where_the_sandbox_cannot_start_commands_are_refused_unless_switched_off(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_BWRAP = "/nonexistent/bwrap"

    refused = tool_execute(_ctx(box), "shell", {"command": "echo hi"}, [])
    settings.SANDBOX_MODE = "off"
    unconfined = tool_execute(_ctx(box), "shell", {"command": "echo hi"}, [])

    assert refused.is_error and "cannot start here" in refused.output
    assert "ANNIHILATION_SANDBOX=off" in refused.output
    assert not unconfined.is_error and "hi" in unconfined.output
    assert sandbox_status().state == "off"


@pytest.mark.django_db
def test_the_operator_sees_the_sandbox_state_on_the_dashboard_and_the_cli(
    box: Box, settings: SettingsWrapper, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.force_login(User.objects.create_user("op", password="pw-for-tests-only"))

    on = client.get("/").content.decode()
    call_command("psychonaut", "agents")
    cli_on = capsys.readouterr().out
    settings.SANDBOX_MODE = "off"
    off = client.get("/").content.decode()
    settings.SANDBOX_MODE = "on"
    settings.SANDBOX_BWRAP = "/nonexistent/bwrap"
    call_command("psychonaut", "agents")
    cli_unavailable = capsys.readouterr().out

    assert 'id="sandbox-state"' in on and ">on<" in on and "bubblewrap" in on
    assert ">off<" in off and "ANNIHILATION_SANDBOX=off" in off
    assert cli_on.startswith("sandbox on: bubblewrap")
    assert cli_unavailable.startswith("sandbox unavailable: /nonexistent/bwrap not found")


@pytest.mark.django_db
def test_an_agent_that_runs_commands_is_refused_where_the_sandbox_cannot_start(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_BWRAP = "/nonexistent/bwrap"
    roles_sync_defaults()
    quantum = quantum_create(title="needs a shell")
    coder = agent_run_create(quantum_id=quantum.pk, role="coder")
    planner_role = Role.objects.get(name="planner")
    planner_role.allowed_tools = ["read_file", "list_dir"]
    planner_role.save()
    planner = agent_run_create(quantum_id=quantum.pk, role="planner")

    refused = agent_run_execute(agent_run_id=coder.pk)
    allowed = agent_run_execute(agent_run_id=planner.pk)

    assert refused.status == "error" and "sandbox cannot start" in refused.error
    assert allowed.status == "done", allowed.error


def test_in_the_shared_tree_the_git_folder_and_the_data_folder_stay_out_of_reach(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.PSYCHONAUTS_WORKSPACE_MODE = "shared"
    settings.ANNIHILATION_HOME = box.repo / ".annihilation"
    (box.repo / ".annihilation").mkdir()
    (box.repo / ".annihilation" / "locks.txt").write_text("the runtime's\n")
    tree = workspace_ensure(quantum_id=QUANTUM)
    refs = git("for-each-ref", cwd=box.repo)

    result = sandbox_run(
        "echo mine > src/new.py; echo x > .annihilation/locks.txt; "
        "echo x > .git/HEAD; git branch -D " + branch_for(OTHER) + "; git status --short",
        workspace=tree, quantum_id=0, timeout_s=20,
    )  # fmt: skip

    assert tree == box.repo
    assert (box.repo / "src" / "new.py").read_text() == "mine\n"
    assert (box.repo / ".annihilation" / "locks.txt").read_text() == "the runtime's\n"
    assert git("for-each-ref", cwd=box.repo) == refs
    assert "src/new.py" in result.stdout


@pytest.mark.django_db
def test_a_fifo_in_the_worktree_does_not_hold_the_file_tools(box: Box) -> None:
    os.mkfifo(box.worktree / "pipe")
    ctx = _ctx(box)
    started = time.monotonic()

    results = [
        tool_execute(ctx, "read_file", {"path": "pipe"}, []),
        tool_execute(ctx, "write_file", {"path": "pipe", "content": "x"}, []),
        tool_execute(ctx, "grep", {"pattern": "x"}, []),
    ]

    assert time.monotonic() - started < 5
    assert results[0].is_error and results[1].is_error and not results[2].is_error


# --- limits per command: all its processes, its /tmp, its worktree --------------------------

# Each process holds 160 MiB, well under the per-process data limit (512 MiB in these tests).
HOLD = (
    "python3 -c \"import time; x = b'x' * (160 * 2**20); print('held', flush=True); "
    'time.sleep(30)"'
)


def _gone(uid: int | None) -> bool:
    """Whether no process of the uid is left (at once: the result is out after they died)."""
    if uid is None:
        return True
    return subprocess.run(["pgrep", "-u", str(uid)], capture_output=True).stdout == b""


def test_the_processes_of_a_command_together_are_held_to_the_memory_limit(box: Box) -> None:
    started = time.monotonic()

    result = box.run(" & ".join([HOLD] * 4) + " & wait", timeout_s=40)

    assert result.stopped == "memory", result.output
    assert time.monotonic() - started < 20
    assert "over the limit of 512.0 MiB" in result.detail and "processes" in result.detail
    assert _gone(sandbox_uid(QUANTUM))


def test_without_the_sandbox_the_memory_of_a_command_s_processes_is_bounded_too(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_MODE = "off"

    result = box.run(" & ".join([HOLD] * 4) + " & wait", timeout_s=40)

    assert not result.sandboxed and result.stopped == "memory", result.output


def test_what_a_command_keeps_in_its_tmp_counts_against_its_memory(box: Box) -> None:
    result = box.run(
        "head -c 300M /dev/zero > /tmp/big && head -c 100M /dev/zero > /dev/shm/big && " + HOLD,
        timeout_s=40,
    )

    assert result.stopped == "memory", result.output
    assert "/tmp and /dev/shm 400.0 MiB" in result.detail


def test_a_command_that_fills_its_worktree_is_stopped_while_it_runs(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_WORKTREE_BYTES = 40 * 2**20
    started = time.monotonic()

    result = box.run("head -c 30M /dev/zero > a.bin; head -c 30M /dev/zero > b.bin; sleep 30")

    assert result.stopped == "worktree", result.output
    assert time.monotonic() - started < 10
    assert "60.0 MiB (limit 40.0 MiB; +60.0 MiB by this command)" in result.detail


def test_a_command_that_leaves_too_many_files_is_reported(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_WORKTREE_FILES = 500

    result = box.run("mkdir many && cd many && seq 1000 | xargs touch && echo made")

    assert result.stopped == "worktree" and "made" in result.stdout
    assert "1,00" in result.detail and "files and folders (limit 500" in result.detail


def test_a_command_that_cleans_a_worktree_over_its_limit_is_not_stopped(
    box: Box, settings: SettingsWrapper
) -> None:
    (box.worktree / "many").mkdir()
    for i in range(600):
        (box.worktree / "many" / str(i)).write_text("x")
    workspace_own(box.worktree, quantum_id=QUANTUM)
    settings.SANDBOX_WORKTREE_FILES = 500

    result = box.run("rm -rf many/1* && ls many | wc -l")

    assert result.stopped == "" and result.returncode == 0, result.detail


def test_an_agent_over_a_limit_is_told_which_and_only_that_command_is_a_trauma(
    box: Box, settings: SettingsWrapper
) -> None:
    settings.SANDBOX_WORKTREE_BYTES = 20 * 2**20
    command = "head -c 30M /dev/zero > dump.bin"

    result = tool_execute(_ctx(box), "shell", {"command": command}, [])

    assert result.is_error and "stopped: its worktree holds 30.0 MiB" in result.output
    trauma = CommandTrauma.objects.get(source=TraumaSource.SANDBOX)
    assert trauma.agent_id == f"{QUANTUM}_s0_coder" and "worktree" in trauma.reason
    assert trauma.quantum_id == QUANTUM and trauma.pattern == trauma_pattern(command)
    assert traumas_for(quantum_id=QUANTUM + 1) == []


# --- identities: a uid per live quantum --------------------------------------------------------


def test_quanta_whose_ids_collide_run_as_different_uids(box: Box) -> None:
    if os.geteuid() != 0:
        pytest.skip("the worker is not root: every command runs as the worker's user")
    other = QUANTUM + 100_000

    uids = {sandbox_uid(QUANTUM), sandbox_uid(other), sandbox_uid(0), sandbox_uid(-1)}

    assert len(uids) == 4
    assert sandbox_uid(QUANTUM) == sandbox_uid(QUANTUM)


@pytest.mark.django_db(transaction=True)  # the two commands run in two threads
def test_one_quantum_s_processes_neither_starve_nor_signal_another_s(
    box: Box, settings: SettingsWrapper
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the worker is not root: every command runs as the worker's user")
    settings.SANDBOX_PROCESSES = 16
    colliding = QUANTUM + 100_000
    theirs = workspace_ensure(quantum_id=colliding)
    results: list[SandboxResult] = []
    holder = threading.Thread(
        target=lambda: results.append(
            box.run(
                "for i in $(seq 12); do sleep 60 & done; touch ready; "
                "until [ -e stop ]; do sleep 0.1; done; jobs -p | wc -l",
                timeout_s=30,
            )
        )
    )
    holder.start()
    try:
        deadline = time.monotonic() + 20
        while not (box.worktree / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (box.worktree / "ready").exists()

        result = sandbox_run(
            "kill -9 -1; for i in 1 2 3 4 5 6; do sleep 0.1 & done; wait; echo forked",
            workspace=theirs, quantum_id=colliding, timeout_s=20,
        )  # fmt: skip
    finally:
        (box.worktree / "stop").touch()
        holder.join(30)

    assert "forked" in result.stdout and "Resource temporarily unavailable" not in result.output
    assert results[0].stdout.split() == ["12"], results[0].output  # its sleepers all lived


# --- what the sandbox can read -----------------------------------------------------------------

TOKEN = f"ghp_{uuid.uuid4().hex}"


def _rot13(text: str) -> str:
    return text.translate(
        str.maketrans(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm",
        )
    )


GIT_SECRET_READS = (
    "cat {GITDIR}/config; cat {GITDIR}/config.worktree; git config -l; git config --list "
    "--show-origin; git remote -v; git config --get-all http.extraheader; "
    "grep -ra ghp_ {GITDIR}; grep -rla ghp_ {GITDIR}; cat {GITDIR}/FETCH_HEAD; "
    "tr 'A-Za-z' 'N-ZA-Mn-za-m' < {GITDIR}/config"
)


@pytest.mark.parametrize("mode", ["worktree", "shared"])
def test_the_repository_s_git_credentials_are_not_readable_inside(
    box: Box, settings: SettingsWrapper, mode: str
) -> None:
    git(
        "config", "remote.origin.url", f"https://bot:{TOKEN}@example.com/org/repo.git", cwd=box.repo
    )
    git("config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*", cwd=box.repo)
    git("config", "http.extraheader", f"Authorization: Bearer {TOKEN}", cwd=box.repo)
    git("config", "credential.helper", f"!echo password={TOKEN}", cwd=box.repo)
    git("config", "branch.main.remote", "origin", cwd=box.repo)
    (box.repo / ".git" / "FETCH_HEAD").write_text(f"abc\t\tbranch 'main' of https://{TOKEN}@x\n")
    module = box.repo / ".git" / "modules" / "lib"
    module.mkdir(parents=True)
    (module / "config").write_text(f'[remote "origin"]\n\turl = https://{TOKEN}@example.com/l\n')
    workspace, quantum = box.worktree, QUANTUM
    if mode == "shared":
        settings.PSYCHONAUTS_WORKSPACE_MODE = "shared"
        workspace, quantum = workspace_ensure(quantum_id=QUANTUM), 0

    result = sandbox_run(
        box.fill(GIT_SECRET_READS) + "; git status; git log --oneline -1; git rev-parse HEAD",
        workspace=workspace, quantum_id=quantum, timeout_s=20,
    )  # fmt: skip

    assert TOKEN not in result.output and _rot13(TOKEN) not in result.output
    assert "ghp_" not in result.output, result.output
    assert "On branch" in result.stdout and "init" in result.stdout, result.output
    assert "repositoryformatversion" in result.stdout  # the config is there, sanitized
    # The worker's own git still reads the whole config.
    assert TOKEN in git("config", "--get", "remote.origin.url", cwd=box.repo)


def test_a_token_added_to_the_git_config_later_is_not_readable_either(box: Box) -> None:
    box.run("git status")
    git("config", "http.extraheader", f"Authorization: Bearer {TOKEN}", cwd=box.repo)

    result = box.run("git config -l; cat {GITDIR}/config")

    assert TOKEN not in result.output and "repositoryformatversion" in result.stdout


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A folder readable by everyone, outside /tmp (which the sandbox hides anyway)."""
    folder = Path("/var/tmp") / f"annihilation-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _readable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for item in (path, *path.parents):
        if item == Path("/var/tmp"):
            break
        item.chmod(0o755 if item.is_dir() else 0o644)


def test_the_worker_s_credential_files_are_not_readable_inside(
    box: Box, outside_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = outside_tmp / "worker-home"
    for name in (".git-credentials", ".netrc", ".config/gh/hosts.yml", ".ssh/id_ed25519"):
        _readable(home / name, f"{TOKEN}\n")
    monkeypatch.setenv("HOME", str(home))

    result = box.run(f"cat {home}/.git-credentials {home}/.netrc; grep -ra ghp_ {home}")

    assert TOKEN not in result.output
    assert "No such file" in result.output


def test_no_installation_on_the_host_reads_another_s_folders(
    box: Box, settings: SettingsWrapper, outside_tmp: Path
) -> None:
    mine, checkout = settings.ANNIHILATION_HOME, settings.BASE_DIR
    theirs = outside_tmp / "other-install" / "home"
    _readable(theirs / "logs" / "worker.log", f"{TOKEN}\n")
    _readable(theirs / "worktrees" / "q-1" / "app.py", f"{TOKEN}\n")
    _readable(outside_tmp / "other-install" / "checkout" / ".env", f"{TOKEN}\n")
    settings.ANNIHILATION_HOME = theirs
    settings.PSYCHONAUTS_WORKTREES = theirs / "worktrees"
    settings.BASE_DIR = outside_tmp / "other-install" / "checkout"
    installation_register()  # what the other installation's worker did when it started
    settings.ANNIHILATION_HOME = mine
    settings.PSYCHONAUTS_WORKTREES = mine / "worktrees"
    settings.BASE_DIR = checkout

    result = box.run(f"cat {theirs}/logs/worker.log; grep -ra ghp_ {outside_tmp}")

    assert TOKEN not in result.output
    assert "No such file" in result.output
    assert box.run("cat src/app.py").returncode == 0  # its own worktree is there


def test_a_registry_entry_cannot_hide_the_system_s_folders(
    box: Box, settings: SettingsWrapper
) -> None:
    registry = Path(settings.SANDBOX_REGISTRY)
    registry.mkdir(exist_ok=True)
    # A folder deep enough, outside the system's, that leads into it.
    link = box.outside / "deep" / "usr-lib"
    link.parent.mkdir(parents=True)
    link.symlink_to("/usr/lib")
    (registry / "hostile.paths").write_text(f"/usr\n/usr/bin\n/etc/ssl\n/\n/var\n{link}\n")

    result = box.run(
        "ls /usr/bin/env /etc/ssl /var/lib /usr/lib/os-release > /dev/null"
        " && git status --short && echo ok"
    )

    assert result.returncode == 0 and "ok" in result.stdout, result.output


def test_an_installation_removed_from_the_host_leaves_the_registry(
    box: Box, settings: SettingsWrapper, outside_tmp: Path
) -> None:
    mine = settings.ANNIHILATION_HOME
    gone = outside_tmp / "gone-home"
    gone.mkdir()
    settings.ANNIHILATION_HOME = gone
    installation_register()
    shutil.rmtree(gone)
    settings.ANNIHILATION_HOME = mine

    installation_register()

    entries = [p.read_text() for p in Path(settings.SANDBOX_REGISTRY).glob("*.paths")]
    assert len(entries) == 1 and entries[0].startswith(f"{Path(mine).resolve()}\n")


def test_handing_a_worktree_to_its_uid_never_follows_a_folder_swapped_for_a_link(
    box: Box,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the worker is not root: files keep the worker's user")
    target = box.outside / "sub"
    for i in range(50):
        (target / f"f{i}").write_text("root's\n")
    owners = {p.name: p.stat().st_uid for p in target.iterdir()}
    folder, link, aside = box.worktree / "d", box.worktree / "l", box.worktree / "d-aside"
    folder.mkdir()
    for i in range(50):
        (folder / f"f{i}").write_text("mine\n")
    link.symlink_to(target)
    stop = threading.Event()

    def swap() -> None:  # what a command of the sandbox could do meanwhile
        while not stop.is_set():
            with contextlib.suppress(OSError):
                folder.rename(aside)
                link.rename(folder)
                folder.rename(link)
                aside.rename(folder)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(150):
            workspace_own(box.worktree, quantum_id=QUANTUM)
    finally:
        stop.set()
        swapper.join(10)

    assert {p.name: p.stat().st_uid for p in target.iterdir()} == owners
