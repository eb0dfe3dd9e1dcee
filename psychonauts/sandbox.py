"""The OS sandbox every process started on an agent's behalf runs in (bubblewrap).

Inside: the whole filesystem read-only; the quantum's worktree the only writable path, plus a
private `/tmp` and `/dev/shm`; the target repository's git folders read-only (agents read
history, only the runtime commits, so no agent creates, moves or deletes a ref); the data folder
(`ANNIHILATION_HOME`), the other quanta's worktrees and `/run` hidden behind empty folders; new
PID, IPC, UTS, cgroup and network namespaces (no network unless ANNIHILATION_SANDBOX_NETWORK);
an environment holding only what a command needs, from bubblewrap itself on (its
`/proc/1/environ` inside shows nothing of the worker's); limits on wall time, CPU time, memory,
processes, file size and output; everything inside is killed with its parent.

The user inside is unprivileged. A worker running as root starts bubblewrap as root (it needs
to reach the worktree's folders) and the command as a real unprivileged uid of its own quantum
(`setpriv`, no capabilities, no new privileges): root's files stay unreadable, and the process
limit counts that quantum's processes only. The worktree belongs to that uid; the runtime's own
git runs with `safe.directory`. A worker running as another user runs bubblewrap in a user
namespace as itself.

`ANNIHILATION_SANDBOX=off` runs commands without the sandbox (same environment and limits);
where bubblewrap cannot start, agents that run commands are refused instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings

from psychonauts.errors import PsychonautError

SandboxState = Literal["on", "off", "unavailable"]

# Each quantum's commands run as their own uid when the worker is root: BASE + id mod SPAN.
UID_SPAN = 100_000
# The identity environments are built as: outside every quantum's range.
BUILDER_UID_OFFSET = UID_SPAN
# Where a repository's environment folder appears inside the sandbox: one fixed path, the same
# when it is built (writable) and when it is used (read-only), so the absolute paths a build
# writes (a virtualenv's scripts, npm's links) hold wherever it is mounted. Under /run, which
# the sandbox mounts empty, so the mount point can be made on a read-only root.
ENV_MOUNT = Path("/run/env")


class SandboxUnavailable(PsychonautError):
    """The sandbox cannot start here, and running without it was not asked for."""


@dataclass(frozen=True)
class SandboxStatus:
    state: SandboxState
    detail: str

    def describe(self) -> str:
        return f"{self.state}: {self.detail}"


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    sandboxed: bool
    # Why it was stopped early: "" (it ended by itself), "timeout", "output".
    stopped: str = ""

    @property
    def output(self) -> str:
        return self.stdout + (f"\n[stderr]\n{self.stderr}" if self.stderr else "")


@dataclass(frozen=True)
class SandboxEnvironment:
    """What a command gets beyond the sandbox's own: a repository's environment folder
    (mounted at ENV_MOUNT, its PATH entries put before the sandbox's PATH, its variables set),
    and/or an egress proxy's unix socket (bound in at ENV_PROXY_SOCKET, the command's only way
    out; `prelude` starts its bridge inside, before the command). `writable` while the folder is
    built: the command then runs as the builder's identity, not a quantum's."""

    folder: Path | None = None
    writable: bool = False
    path: tuple[str, ...] = ()
    variables: tuple[tuple[str, str], ...] = ()
    proxy: Path | None = None
    prelude: str = ""

    def bind_args(self) -> list[str]:
        args: list[str] = []
        if self.folder is not None:
            args += ["--bind" if self.writable else "--ro-bind", str(self.folder), str(ENV_MOUNT)]
        if self.proxy is not None:
            args += ["--bind", str(self.proxy), str(ENV_PROXY_SOCKET)]
        return args

    def variables_with(self, base_path: str) -> dict[str, str]:
        found = dict(self.variables)
        if self.folder is not None:
            found["ANNIHILATION_ENV"] = str(ENV_MOUNT)
        entries = [e if e.startswith("/") else f"{ENV_MOUNT}/{e}" for e in self.path]
        found["PATH"] = ":".join([*entries, base_path])
        return found


# The egress proxy's socket inside the sandbox (beside the environment, under the empty /run).
ENV_PROXY_SOCKET = Path("/run/proxy.sock")


def _is_root() -> bool:
    return os.geteuid() == 0


def sandbox_uid(quantum_id: int) -> int | None:
    """The uid a quantum's commands run as, or None when they run as the worker's own user."""
    if not _is_root():
        return None
    return int(settings.SANDBOX_UID_BASE) + quantum_id % UID_SPAN


def builder_uid() -> int | None:
    """The uid environments are built as (no quantum's), or None as for `sandbox_uid`."""
    if not _is_root():
        return None
    return int(settings.SANDBOX_UID_BASE) + BUILDER_UID_OFFSET


def _traversable(folder: Path, uid: int) -> bool:
    """Whether `uid` (no groups) may pass through `folder`."""
    try:
        st = folder.stat()
    except OSError:
        return False
    bit = 0o100 if st.st_uid == uid else 0o001
    return bool(st.st_mode & bit)


def _git_dirs(workspace: Path) -> list[Path]:
    """The git folders a workspace's git reads: its own (a worktree's `.git` file points into the
    repository's `worktrees/`) and the shared one (objects, refs)."""
    dot = workspace / ".git"
    if dot.is_dir():
        return [dot.resolve()]
    try:
        line = dot.read_text(encoding="utf-8").strip()
    except OSError:
        return []
    if not line.startswith("gitdir:"):
        return []
    own = (workspace / line.removeprefix("gitdir:").strip()).resolve()
    found = [own]
    try:
        common = (own / (own / "commondir").read_text(encoding="utf-8").strip()).resolve()
        found.append(common)
    except OSError:
        pass
    return found


def _under(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _hidden_roots(
    uid: int | None, needed: Sequence[Path], private: Sequence[Path]
) -> tuple[list[Path], list[Path]]:
    """Folders mounted empty inside: private ones, the data folder, the worktrees, and (for an
    unprivileged uid) the first folder above each needed path that the uid could not pass.
    Returns those to mount before the workspace's binds, and those inside the workspace (the
    data folder inside the shared tree), to mount after them: its bind would show them again."""
    hidden = [Path("/tmp"), Path("/dev/shm"), Path("/run")]
    for folder in private:
        path = folder.resolve()
        if path != Path("/") and path.is_dir():  # what does not exist needs no hiding
            hidden.append(path)
    if uid is not None:
        for path in needed:
            for ancestor in reversed(path.parents):
                if any(_under(ancestor, h) for h in hidden):
                    break
                if not _traversable(ancestor, uid):
                    hidden.append(ancestor)
                    break
    workspace = needed[0]
    inside = sorted({h for h in hidden if h != workspace and _under(h, workspace)})
    # An outer hidden folder covers the inner ones; each is mounted once, outermost first.
    hidden = sorted(set(hidden) - set(inside), key=lambda p: len(p.parts))
    outer = [h for i, h in enumerate(hidden) if not any(_under(h, o) for o in hidden[:i])]
    return outer, inside


def _mount_args(workspace: Path, uid: int | None) -> tuple[str, ...]:
    """The mounts of a workspace's sandbox. Each agent's every command needs them, and they
    change only with the settings: worked out once per workspace and settings (reading the
    worktree's git pointer and checking the folders above it cost ~0.7 ms a command)."""
    return _mounts(
        workspace, uid, Path(settings.ANNIHILATION_HOME), Path(settings.PSYCHONAUTS_WORKTREES),
        tuple(settings.SANDBOX_HIDE), int(settings.SANDBOX_TMP_BYTES),
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _mounts(
    workspace: Path, uid: int | None, home: Path, worktrees: Path, hide: tuple[Path, ...],
    tmp_bytes: int,
) -> tuple[str, ...]:  # fmt: skip
    git_dirs = _git_dirs(workspace)
    needed = [workspace, *git_dirs]
    hidden, inside = _hidden_roots(uid, needed, (home, worktrees, *hide))
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for folder in hidden:
        perms = "1777" if folder in (Path("/tmp"), Path("/dev/shm")) else "0755"
        args += _empty(folder, perms, tmp_bytes)
    made: set[Path] = set()
    for path in needed:
        # Folders above a bind inside an empty mount are made passable (bubblewrap would make
        # them 0700, owned by root).
        for ancestor in reversed(path.parents):
            if ancestor in made or not any(_under(ancestor, h) and ancestor != h for h in hidden):
                continue
            args += ["--perms", "0755", "--dir", str(ancestor)]
            made.add(ancestor)
    # Git folders read-only, then the worktree writable, then its `.git` pointer read-only
    # again (a rewritten pointer would send the runtime's commit to another repository).
    for folder in git_dirs:
        args += ["--ro-bind", str(folder), str(folder)]
    args += ["--bind", str(workspace), str(workspace)]
    for folder in git_dirs:
        if _under(folder, workspace):
            args += ["--ro-bind", str(folder), str(folder)]
    dot = workspace / ".git"
    if dot.is_file():
        args += ["--ro-bind", str(dot), str(dot)]
    for folder in inside:
        args += _empty(folder, "0755", tmp_bytes)
    return tuple(args)


def _empty(folder: Path, perms: str, size: int) -> list[str]:
    return ["--perms", perms, "--size", str(size), "--tmpfs", str(folder)]


def shell_argv(command: str, timeout_s: float) -> list[str]:
    """`bash -c command` with the limits set first, in the same shell: soft and hard alike, so
    they hold for everything the command starts and none of it can raise them (no process of
    its own to start for them)."""
    cpu = max(1, int(min(timeout_s, settings.SANDBOX_CPU_S)))
    limits = (
        f"ulimit -t {cpu}"
        # The data limit, not the address space: runtimes that reserve large address ranges
        # (V8, the JVM, Go) still start, while what is actually allocated is bounded.
        f" -d {settings.SANDBOX_MEMORY_BYTES // 1024}"
        f" -u {settings.SANDBOX_PROCESSES}"
        f" -f {settings.SANDBOX_FILE_BYTES // 1024}"  # bash counts in KiB
        " -c 0 || exit 125"
    )
    return ["bash", "-c", f"{limits}\n{command}"]


def _environment(home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """All a command gets (and bubblewrap too): no variable of the worker's. `home`: the
    sandbox's private /tmp, so that dot-files and caches do not land in the agent's commit (the
    workspace itself when unconfined)."""
    return {
        "PATH": settings.SANDBOX_PATH,
        "HOME": str(home),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        # The worktree and the repository's git folders belong to other users than the one
        # inside (the runtime's, root's): git is told they are fine to read.
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        **extra,
    }


def sandbox_argv(
    argv: Sequence[str],
    *,
    workspace: Path,
    quantum_id: int,
    environment: SandboxEnvironment | None = None,
) -> list[str]:
    """The full command line that runs `argv` in the sandbox of a quantum's workspace (with a
    repository's environment mounted, when given)."""
    workspace = workspace.resolve()
    building = environment is not None and environment.writable
    uid = builder_uid() if building else sandbox_uid(quantum_id)
    box = [settings.SANDBOX_BWRAP, *_mount_args(workspace, uid)]
    if environment is not None:
        box += environment.bind_args()
    box += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not settings.SANDBOX_NETWORK:
        box.append("--unshare-net")
    # Bubblewrap's own init stays the namespace's PID 1: it keeps the signal that kills it
    # with its parent, which the command loses when it becomes the quantum's uid, and when it
    # dies the kernel kills everything in the namespace.
    box += ["--die-with-parent", "--new-session", "--chdir", str(workspace)]
    if uid is None:
        box += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--"]
        return [*box, *argv]
    # Only what setpriv needs to become the quantum's uid; it drops these too.
    box += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--cap-add", "CAP_SETPCAP", "--"]  # fmt: skip
    drop = [
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
    ]  # fmt: skip
    return [*box, *drop, *argv]


def sandbox_run(
    command: str,
    *,
    workspace: Path,
    quantum_id: int,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    environment: SandboxEnvironment | None = None,
) -> SandboxResult:
    """Run a shell command in the sandbox of the workspace, within the limits (without the
    sandbox where it is switched off: the same environment and limits). `environment`: a
    repository's environment folder, mounted at ENV_MOUNT with its PATH and variables.

    SandboxUnavailable when the sandbox cannot start and is not switched off; an environment
    needs the sandbox (its fixed path exists only inside one)."""
    status = sandbox_status()
    if status.state == "unavailable":
        raise SandboxUnavailable(_refusal(status))
    if environment is not None and status.state == "off":
        raise SandboxUnavailable(
            f"the repository's environment is mounted at {ENV_MOUNT} inside the sandbox, and "
            "ANNIHILATION_SANDBOX=off runs commands without one"
        )
    if environment is not None and environment.prelude:
        command = f"{environment.prelude}{command}"
    argv = shell_argv(command, timeout_s)
    extra = dict(env or {})
    if environment is not None:
        extra = {**environment.variables_with(settings.SANDBOX_PATH), **extra}
    if status.state == "on":
        argv = sandbox_argv(
            argv, workspace=workspace, quantum_id=quantum_id, environment=environment
        )
    environment_vars = _environment(Path("/tmp") if status.state == "on" else workspace, extra)
    return _execute(argv, cwd=workspace, env=environment_vars, timeout_s=timeout_s,
                    sandboxed=status.state == "on")  # fmt: skip


def _refusal(status: SandboxStatus) -> str:
    return (
        f"the agent sandbox cannot start here ({status.detail}); agents may not run commands "
        "without it. Install bubblewrap and allow user namespaces, or set ANNIHILATION_SANDBOX=off "
        "to run agents' commands unconfined"
    )


def _execute(
    argv: Sequence[str], *, cwd: Path, env: dict[str, str], timeout_s: float, sandboxed: bool
) -> SandboxResult:
    """Run to the end, the wall-time limit or the output limit, whichever comes first; the
    whole process group is killed on a limit. Output past the limit is not kept."""
    limit = int(settings.SANDBOX_OUTPUT_BYTES)
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total, stopped = 0, ""
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        deadline = started + timeout_s
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = "timeout"
                break
            for key, _ in sel.select(timeout=left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                keep = data[: max(0, limit - total)]
                chunks[key.fd].append(keep)
                total += len(data)
                if total > limit:
                    stopped = "output"
                    break
            if stopped:
                break
    if stopped:
        _kill_group(proc)
    try:
        returncode = proc.wait(timeout=max(0.1, started + timeout_s + 5 - time.monotonic()))
    except subprocess.TimeoutExpired:
        # Its pipes closed early (a daemonised child) and it outlived the wall time.
        stopped = stopped or "timeout"
        _kill_group(proc)
        returncode = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    out, err = b"".join(chunks[out_fd]), b"".join(chunks[err_fd])
    return SandboxResult(
        returncode=returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        elapsed_s=time.monotonic() - started,
        sandboxed=sandboxed,
        stopped=stopped,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group; bubblewrap's --die-with-parent and the PID namespace take
    whatever inside escaped the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def workspace_own(path: Path, *, quantum_id: int) -> None:
    """Hand a workspace's files to the quantum's sandbox user (a root worker only). Its `.git`
    pointer stays root's; the runtime's git works on it with `safe.directory`."""
    uid = sandbox_uid(quantum_id)
    if uid is None or settings.SANDBOX_MODE == "off":
        return
    for item in _walk_no_git(path):
        os.lchown(item, uid, uid)


def path_own(path: Path, *, quantum_id: int) -> None:
    """One file or folder the runtime wrote in a workspace: the quantum's sandbox user's."""
    uid = sandbox_uid(quantum_id)
    if uid is not None and settings.SANDBOX_MODE != "off":
        os.lchown(path, uid, uid)


def _walk_no_git(root: Path) -> Iterator[Path]:
    yield root
    for folder, dirs, files in os.walk(root):
        base = Path(folder)
        if base == root:
            dirs[:] = [d for d in dirs if d != ".git"]
            files = [f for f in files if f != ".git"]
        for name in (*dirs, *files):
            yield base / name


_status_lock = threading.Lock()
# A sandbox that started once starts again: kept per process. A failure is probed again on the
# next command (it may have been passing: a fork refused under load).
_started: dict[tuple[str, str], SandboxStatus] = {}


def _probe(bwrap: str, home: str) -> SandboxStatus:
    """Start one sandbox for real (the checks a user namespace or a mount can fail)."""
    if shutil.which(bwrap) is None:
        return SandboxStatus(
            "unavailable", f"{bwrap} not found (Debian: apt-get install bubblewrap)"
        )
    if _is_root() and shutil.which("setpriv") is None:
        return SandboxStatus("unavailable", "setpriv not found (Debian: util-linux)")
    probe = Path(home) / "sandbox-probe"
    probe.mkdir(parents=True, exist_ok=True)
    workspace_own(probe, quantum_id=0)
    try:
        result = _execute(
            sandbox_argv(
                shell_argv("echo ok > probe && cat probe", 10), workspace=probe, quantum_id=0
            ),
            cwd=probe,
            env=_environment(probe, {}),
            timeout_s=10,
            sandboxed=True,
        )
    except OSError as exc:
        return SandboxStatus("unavailable", f"bubblewrap did not start: {exc}")
    if result.returncode != 0 or result.stdout.strip() != "ok":
        why = (result.stderr or result.stdout).strip().splitlines()
        return SandboxStatus(
            "unavailable", f"bubblewrap failed: {why[-1] if why else result.returncode}"
        )
    who = "an unprivileged uid per quantum" if _is_root() else "the worker's user, namespaced"
    net = "network allowed" if settings.SANDBOX_NETWORK else "no network"
    return SandboxStatus("on", f"bubblewrap, {who}, {net}")


def sandbox_status() -> SandboxStatus:
    """Whether agents' commands run sandboxed here: on, off (by setting), or unavailable."""
    if settings.SANDBOX_MODE == "off":
        return SandboxStatus("off", "ANNIHILATION_SANDBOX=off: agents' commands run unconfined")
    key = (settings.SANDBOX_BWRAP, str(Path(settings.ANNIHILATION_HOME).resolve()))
    with _status_lock:
        status = _started.get(key) or _probe(*key)
        if status.state == "on":
            _started[key] = status
        return status


def sandbox_require() -> None:
    """SandboxUnavailable unless commands can run (sandboxed, or unconfined by setting)."""
    status = sandbox_status()
    if status.state == "unavailable":
        raise SandboxUnavailable(_refusal(status))
