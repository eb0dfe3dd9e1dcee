"""The OS sandbox every process started on an agent's behalf runs in (bubblewrap).

Inside: the whole filesystem read-only; the quantum's worktree the only writable path, plus a
private `/tmp` and `/dev/shm`; the target repository's git folders read-only (agents read
history, only the runtime commits, so no agent creates, moves or deletes a ref); the data folder
(`ANNIHILATION_HOME`), the other quanta's worktrees and `/run` hidden behind empty folders; new
PID, IPC, UTS, cgroup and network namespaces (no network unless ANNIHILATION_SANDBOX_NETWORK);
an environment holding only what a command needs, from bubblewrap itself on (its
`/proc/1/environ` inside shows nothing of the worker's); limits on wall time, CPU time, memory,
processes, file size and output; everything inside is killed with its parent.

Nothing secret is readable inside: the worker's home, `/root`, and every folder of every
installation on the host (its data folder, worktrees, clone, repository and checkout, from the
host's registry of installations) are mounted empty, the worktree and its git folders bound
back in; the repository's git config is replaced by a copy holding only what git needs to read
history (no remote URL, no header, no credential helper).

A watchdog samples every command while it runs: the memory of all its processes together plus
its /tmp and /dev/shm, and what its worktree holds (bytes, files). Over a limit, the whole
sandbox is killed and the result says which limit and by how much.

The user inside is unprivileged. A worker running as root starts bubblewrap as root (it needs
to reach the worktree's folders) and the command as a real unprivileged uid that no other live
quantum holds (psychonauts/containment/identities.py; `setpriv`, no capabilities, no new privileges):
root's files stay unreadable, and the process limit counts that quantum's processes only. The
worktree belongs to that uid; the runtime's own git runs with `safe.directory`. A worker
running as another user runs bubblewrap in a user namespace as itself.

`ANNIHILATION_SANDBOX=off` runs commands without the sandbox (same environment and limits);
where bubblewrap cannot start, agents that run commands are refused instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import pwd
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings
from django.db import connection

from psychonauts.containment.beneath import tree_chown
from psychonauts.containment.identities import BUILDER_SLOT, PROBE_SLOT, identity_slot
from psychonauts.errors import PsychonautError
from psychonauts.workspaces.git import git_command

logger = logging.getLogger(__name__)

SandboxState = Literal["on", "off", "unavailable"]
# Why a command was stopped early: "" (it ended by itself), "timeout", "output", "memory" (all
# its processes and its /tmp together), "worktree" (what its worktree holds).
Stopped = Literal["", "timeout", "output", "memory", "worktree"]
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
    stopped: Stopped = ""
    # For a limit the watchdog enforced: what was measured against which limit, for the agent.
    detail: str = ""

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
    """The uid a quantum's commands run as (its own: no other live quantum holds it), or None
    when they run as the worker's own user."""
    if not _is_root():
        return None
    return int(settings.SANDBOX_UID_BASE) + identity_slot(quantum_id=quantum_id)


def _probe_uid() -> int | None:
    """The sandbox probe's uid: a slot no holder is given, taken without the database."""
    return int(settings.SANDBOX_UID_BASE) + PROBE_SLOT if _is_root() else None


def builder_uid() -> int | None:
    """The uid environments are built as (no quantum's), or None as for `sandbox_uid`."""
    if not _is_root():
        return None
    return int(settings.SANDBOX_UID_BASE) + BUILDER_SLOT


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
    """Whether `path` is `folder` or inside it (both absolute and resolved). Compared as text:
    pathlib's `is_relative_to` costs about 15 µs a call, and a sandbox's mounts make thousands."""
    inner, outer = str(path), str(folder)
    return inner == outer or inner.startswith(outer if outer.endswith("/") else outer + "/")


def _hidden_roots(
    uid: int | None, needed: Sequence[Path], private: Sequence[Path]
) -> tuple[list[Path], list[Path]]:
    """Folders mounted empty inside: private ones, the data folder, the worktrees, and (for an
    unprivileged uid) the first folder above each needed path that the uid could not pass.
    Returns those to mount before the workspace's binds, and those inside the workspace (the
    data folder inside the shared tree), to mount after them: its bind would show them again."""
    hidden = [Path("/tmp"), Path("/dev/shm"), Path("/run")]
    # `private` is resolved (_hidden_folders); what does not exist needs no hiding.
    hidden += [folder for folder in private if folder.is_dir()]
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
    change only with the settings and the installations on the host: worked out once per
    workspace and those (reading the worktree's git pointer and checking the folders above it
    for every command cost more than the command's own start). The git configs are looked at on every command: one changed (a
    remote with a token added) is sanitized again before the next command reads it."""
    args, configs = _mounts(workspace, uid, _hidden_folders(), int(settings.SANDBOX_TMP_BYTES))
    return args + _git_config_binds(configs)


def _installation_folders() -> list[Path]:
    """This installation's folders: data, worktrees, clone, repository, checkout."""
    found = [
        Path(settings.ANNIHILATION_HOME), Path(settings.PSYCHONAUTS_WORKTREES),
        Path(settings.ANNIHILATION_CLONE), Path(settings.BASE_DIR),
    ]  # fmt: skip
    if isinstance(settings.ANNIHILATION_REPO, Path):
        found.append(Path(settings.ANNIHILATION_REPO))
    return found


def _worker_homes() -> list[Path]:
    """The worker's home (its credentials: ~/.git-credentials, ~/.ssh, ~/.netrc, ~/.aws, ...)
    and root's."""
    homes = [Path("/root")]
    with contextlib.suppress(RuntimeError):  # no HOME and no account
        homes.append(Path("~").expanduser())
    with contextlib.suppress(KeyError):
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    return homes


def _hidden_folders() -> tuple[Path, ...]:
    """Every folder mounted empty (those a command needs are bound back in), resolved."""
    own = [*_installation_folders(), *_worker_homes(), *map(Path, settings.SANDBOX_HIDE)]
    found = {p.resolve() for p in own if p.is_absolute()}
    found.update(_registered(Path(settings.SANDBOX_REGISTRY)))
    return tuple(sorted(p for p in found if p != Path("/")))


def _registered(registry: Path) -> tuple[Path, ...]:
    """The folders every installation on the host listed in the registry (read again only when
    the registry's folder changed: each entry is written whole and renamed into place)."""
    try:
        changed = registry.stat().st_mtime_ns
    except OSError:
        return ()
    return _registry_read(registry, changed)


# Top folders of the system: a registry entry naming one of them (or a folder in one) is
# ignored, so that no entry (any local user can add one) hides what every command needs.
_SYSTEM = frozenset(
    {"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "boot", "dev", "proc", "sys"}
)


@functools.lru_cache(maxsize=8)
def _registry_read(registry: Path, changed: int) -> tuple[Path, ...]:
    """The registry's folders, resolved (once per change of the registry: a host lists every
    installation's, hundreds where many test runs left theirs)."""
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in registry.iterdir():
            if entry.suffix != ".paths":
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                for line in entry.read_text("utf-8").splitlines():
                    # At least two levels deep (`/srv/app`, not `/srv`), outside the system's,
                    # as written and where it leads.
                    path = Path(line)
                    if not path.is_absolute():
                        continue
                    paths = (path, path.resolve())
                    if all(len(p.parts) >= 3 and p.parts[1] not in _SYSTEM for p in paths):
                        found.append(paths[1])
    return tuple(found)


def installation_register() -> None:
    """List this installation's folders in the host's registry, so that the sandboxes of every
    installation hide them (an installation that cannot write there logs why: its own sandboxes
    hide its folders all the same)."""
    registry = Path(settings.SANDBOX_REGISTRY)
    home = str(Path(settings.ANNIHILATION_HOME).resolve())
    entry = registry / f"{hashlib.sha256(home.encode()).hexdigest()[:24]}.paths"
    # The data folder first: an entry whose data folder is gone is an installation removed.
    folders = [home, *sorted({str(p.resolve()) for p in _installation_folders()} - {home})]
    text = "".join(f"{folder}\n" for folder in folders)
    try:
        current: str | None = entry.read_text("utf-8")
    except OSError:
        current = None
    if current != text:
        try:
            if not registry.is_dir():
                registry.mkdir(parents=True, exist_ok=True)
                # Every installation on the host, whatever its user, adds its own entry; the
                # sticky bit keeps each entry its owner's.
                registry.chmod(0o1777)
            scratch = registry / f".{entry.name}.{os.getpid()}"
            scratch.write_text(text, "utf-8")
            scratch.chmod(0o644)
            scratch.replace(entry)
        except OSError as exc:
            logger.warning("could not list this installation in %s: %s", registry, exc)
            return
    # Whether or not this entry changed: an installation removed since is dropped.
    for other in registry.glob("*.paths"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            first = other.read_text("utf-8").partition("\n")[0]
            if first and not Path(first).exists():
                other.unlink()


@functools.lru_cache(maxsize=4096)
def _mounts(
    workspace: Path, uid: int | None, hide: tuple[Path, ...], tmp_bytes: int
) -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """The mounts, and the git config files to show sanitized."""
    git_dirs = _git_dirs(workspace)
    needed = [workspace, *git_dirs]
    hidden, inside = _hidden_roots(uid, needed, hide)
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
    configs = [
        folder / name for folder in git_dirs for name in ("config", "config.worktree", "FETCH_HEAD")
    ]
    # Submodules' git folders (`modules/<name>/`) carry their own remote URLs.
    for folder in git_dirs:
        configs += sorted((folder / "modules").glob("**/config"))
        configs += sorted((folder / "modules").glob("**/FETCH_HEAD"))
    return tuple(args), tuple(configs)


# What of a repository's git config the sandbox shows: what git needs to read the repository
# (format, extensions, the checkout's settings) and to say how a branch stands against its
# upstream. Remote URLs, headers, credential helpers, proxies, includes, hooks and programs
# are left out.
_GIT_CONFIG_KEPT = re.compile(
    r"core\.(repositoryformatversion|bare|filemode|symlinks|ignorecase|precomposeunicode"
    r"|logallrefupdates|autocrlf|eol|safecrlf|checkstat|trustctime|quotepath|splitindex"
    r"|untrackedcache|commitgraph|multipackindex|abbrev|compression|sparsecheckout"
    r"|sparsecheckoutcone)"
    r"|extensions\.[a-z0-9]+|index\.[a-z0-9]+|feature\.[a-z0-9]+|init\.defaultbranch"
    r"|branch\..+\.(remote|merge|rebase)|remote\.[^.]+\.fetch"
)


def _git_config_binds(configs: Sequence[Path]) -> tuple[str, ...]:
    """Binds that show each existing git config file sanitized, and FETCH_HEAD (which names
    the URL fetched from) empty."""
    args: list[str] = []
    for path in configs:
        try:
            st = path.stat()
        except OSError:
            continue
        if path.name == "FETCH_HEAD":
            args += ["--ro-bind", "/dev/null", str(path)]
            continue
        clean = _git_config_sanitized(path, st.st_ino, st.st_size, st.st_mtime_ns)
        args += ["--ro-bind", str(clean), str(path)]
    return tuple(args)


@functools.lru_cache(maxsize=1024)
def _git_config_sanitized(path: Path, inode: int, size: int, changed: int) -> Path:
    """A copy of a git config file holding only the kept keys (written again when the file
    changes: its inode, size and time are the cache key)."""
    # Nothing but the file itself (includes are off for --file), read by the hardened runner.
    command = git_command("config", "--file", str(path), "--null", "--list", cwd=Path("/"))
    listed = subprocess.run(
        command.argv, cwd="/", env=command.env, capture_output=True, timeout=30, check=False
    )
    sections: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for item in listed.stdout.decode("utf-8", errors="replace").split("\0"):
        key, _, value = item.partition("\n")
        if not key or not _GIT_CONFIG_KEPT.fullmatch(key.lower()):
            continue
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        sections.setdefault((section, sub), []).append((name, value if "\n" in item else "true"))
    lines: list[str] = []
    for (section, sub), items in sections.items():
        lines.append(f'[{section} "{_git_quote(sub)}"]' if sub else f"[{section}]")
        lines += [f'\t{name} = "{_git_quote(value)}"' for name, value in items]
    folder = _git_config_folder()
    folder.mkdir(parents=True, exist_ok=True)
    clean = folder / f"{hashlib.sha256(str(path).encode()).hexdigest()[:24]}-{path.name}"
    scratch = folder / f".{clean.name}.{os.getpid()}.{threading.get_ident()}"
    scratch.write_text("".join(f"{line}\n" for line in lines), "utf-8")
    scratch.chmod(0o644)
    scratch.replace(clean)
    return clean


def _git_config_folder() -> Path:
    return Path(settings.ANNIHILATION_HOME) / "sandbox" / "git-config"


def _git_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")


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
    info_fd: int | None = None,
    environment: SandboxEnvironment | None = None,
) -> list[str]:
    """The full command line that runs `argv` in the sandbox of a quantum's workspace (with a
    repository's environment mounted, when given). `info_fd`: where bubblewrap writes its
    namespaces (for the watchdog)."""
    building = environment is not None and environment.writable
    uid = builder_uid() if building else sandbox_uid(quantum_id)
    return _boxed(argv, workspace.resolve(), uid, info_fd, environment)


def _boxed(
    argv: Sequence[str],
    workspace: Path,
    uid: int | None,
    info_fd: int | None,
    environment: SandboxEnvironment | None = None,
) -> list[str]:
    box = [settings.SANDBOX_BWRAP, *_mount_args(workspace, uid)]
    if environment is not None:
        box += environment.bind_args()
    box += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not settings.SANDBOX_NETWORK:
        box.append("--unshare-net")
    if info_fd is not None:
        box += ["--info-fd", str(info_fd)]
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


@dataclass(frozen=True)
class _Box:
    """What wraps a command in bubblewrap: the workspace, the uid it runs as (None: the worker's
    own, in a user namespace), and a repository's environment to mount."""

    workspace: Path
    uid: int | None
    environment: SandboxEnvironment | None = None


@dataclass(frozen=True)
class Watch:
    """What the watchdog holds a command to. `worktree`: the folder whose size and file count
    are bounded (None: not watched); `skip`: folders in it not counted (the git folder, the data
    folder inside the shared tree)."""

    memory_bytes: int
    sample_s: float
    worktree: Path | None = None
    skip: tuple[Path, ...] = ()
    worktree_bytes: int = 0
    worktree_files: int = 0

    @classmethod
    def of(cls, workspace: Path) -> Watch:
        root = workspace.resolve()
        skip = [root / ".git"]
        for folder in (Path(settings.ANNIHILATION_HOME), Path(settings.PSYCHONAUTS_WORKTREES)):
            folder = folder.resolve()
            if folder != root and _under(folder, root):
                skip.append(folder)
        return cls(
            memory_bytes=int(settings.SANDBOX_MEMORY_BYTES),
            sample_s=float(settings.SANDBOX_SAMPLE_S),
            worktree=root,
            skip=tuple(skip),
            worktree_bytes=int(settings.SANDBOX_WORKTREE_BYTES),
            worktree_files=int(settings.SANDBOX_WORKTREE_FILES),
        )


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
    boxed = status.state == "on"
    building = environment is not None and environment.writable
    uid: int | None = None
    if boxed:
        uid = builder_uid() if building else _uid_no_connection_kept(quantum_id)
    if uid is not None and not building and workspace.stat().st_uid != uid:
        # The quantum's uid changed since its worktree was made (its slot went to another
        # quantum while it did not run): its files become the new uid's before it writes.
        _own(workspace, uid)
    variables = _environment(Path("/tmp") if boxed else workspace, extra)
    return _execute(argv, cwd=workspace, env=variables, timeout_s=timeout_s,
                    sandboxed=boxed, watch=Watch.of(workspace),
                    box=_Box(workspace.resolve(), uid, environment) if boxed else None)  # fmt: skip


def _uid_no_connection_kept(quantum_id: int) -> int | None:
    """The quantum's uid, leaving the database connection as it was: a caller that handed its
    connection back before a command of minutes (the agent runtime does), or a thread that
    never uses the database otherwise (the worktree preparers), does not sit on the one the
    lookup opened."""
    was_open = connection.connection is not None
    try:
        return sandbox_uid(quantum_id)
    finally:
        if not was_open and not connection.in_atomic_block:
            connection.close()


def _refusal(status: SandboxStatus) -> str:
    return (
        f"the agent sandbox cannot start here ({status.detail}); agents may not run commands "
        "without it. Install bubblewrap and allow user namespaces, or set ANNIHILATION_SANDBOX=off "
        "to run agents' commands unconfined"
    )


def _execute(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    sandboxed: bool,
    watch: Watch | None = None,
    box: _Box | None = None,
) -> SandboxResult:
    """Run to the end, the wall-time limit, the output limit or a limit of the watchdog,
    whichever comes first; the whole sandbox is killed on a limit. Output past the limit is not
    kept. `box`: what wraps `argv` in bubblewrap (its namespaces reported to the
    watchdog)."""
    limit = int(settings.SANDBOX_OUTPUT_BYTES)
    info_r = info_w = -1
    if box is not None:
        info_r, info_w = os.pipe()
        os.set_blocking(info_r, False)
        argv = _boxed(argv, box.workspace, box.uid, info_w, box.environment)
    # Every tmpfs the sandbox mounts (its /tmp, /dev/shm, the empty folders): memory it may fill.
    tmpfs = tuple(argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--tmpfs")
    dog = (
        _Watchdog(watch, sandboxed=box is not None, info_fd=info_r, tmpfs=tmpfs) if watch else None
    )
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(info_w,) if info_w >= 0 else (),
        )
    except BaseException:
        for fd in (info_r, info_w):
            if fd >= 0:
                os.close(fd)
        raise
    if info_w >= 0:
        os.close(info_w)
    try:
        return _follow(proc, dog, started=started, timeout_s=timeout_s, limit=limit,
                       sandboxed=sandboxed)  # fmt: skip
    finally:
        if info_r >= 0:
            os.close(info_r)


def _follow(
    proc: subprocess.Popen[bytes],
    dog: _Watchdog | None,
    *,
    started: float,
    timeout_s: float,
    limit: int,
    sandboxed: bool,
) -> SandboxResult:
    assert proc.stdout is not None and proc.stderr is not None
    if dog is not None:
        dog.begin(proc.pid, started)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    total, stopped = 0, ""
    deadline = started + timeout_s
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                stopped = "timeout"
                break
            if dog is not None and dog.due <= now:
                stopped = dog.sample()
                if stopped:
                    break
            wait = left if dog is None else max(0.0, min(left, dog.due - now))
            for key, _ in sel.select(timeout=wait):
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
    # Its pipes closed: it ends by itself, or (a daemonised child) is killed at the wall time;
    # the watchdog goes on meanwhile.
    returncode: int | None = None
    while returncode is None:
        now = time.monotonic()
        if not stopped and now >= deadline + 5:
            stopped = "timeout"
            _kill_group(proc)
        if not stopped and dog is not None and dog.due <= now:
            stopped = dog.sample()
            if stopped:
                _kill_group(proc)
        wait = 5.0 if stopped else max(0.01, min(deadline + 5 - now, dog.due - now if dog else 5))
        try:
            returncode = proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    if stopped and dog is not None:
        dog.wait_gone(5.0)
    if not stopped and dog is not None:
        stopped = dog.finish()  # what it left in the worktree
    proc.stdout.close()
    proc.stderr.close()
    out, err = b"".join(chunks[out_fd]), b"".join(chunks[err_fd])
    return SandboxResult(
        returncode=returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        elapsed_s=time.monotonic() - started,
        sandboxed=sandboxed,
        stopped=stopped,  # type: ignore[arg-type]
        detail=dog.detail if dog is not None and stopped in ("memory", "worktree") else "",
    )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Watchdog:
    """Samples a running command every `sample_s`: the memory of all its processes together
    (the sandbox's PID namespace; without the sandbox, the processes below the command) plus
    what its private /tmp and /dev/shm hold; and, less often (a walk costs more), what its
    worktree holds. Which limit a command went over is kept in `detail`, for the agent."""

    def __init__(
        self, watch: Watch, *, sandboxed: bool, info_fd: int, tmpfs: Sequence[str] = ()
    ) -> None:
        self.watch = watch
        self.tmpfs = tmpfs
        self.sandboxed = sandboxed
        self.info_fd = info_fd
        self.info = b""
        self.namespace = ""
        self.init_pid = 0
        self.root = 0
        self.due = float("inf")
        self.tree_due = float("inf")
        self.base = (0, 0)
        self.detail = ""
        if watch.worktree is not None:
            # What the worktree held before: a command that only removes files from a tree
            # over a limit is not stopped (it is how an agent gets back under it).
            self.base = self._walk()

    def begin(self, pid: int, started: float) -> None:
        self.root = pid
        self.due = started + self.watch.sample_s

    def sample(self) -> Stopped:
        now = time.monotonic()
        self.due = now + self.watch.sample_s
        if self._memory_over():
            return "memory"
        if self.watch.worktree is not None and now >= self.tree_due and self._worktree_over():
            return "worktree"
        return ""

    def wait_gone(self, timeout_s: float) -> None:
        """After a kill: until every process of the sandbox is gone (the kernel empties a PID
        namespace after its init died), so that the memory is free when the result is out."""
        if not self.namespace:
            return
        deadline = time.monotonic() + timeout_s
        while self._members() and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self) -> Stopped:
        """What the command left in its worktree, once it ended."""
        return "worktree" if self.watch.worktree is not None and self._worktree_over() else ""

    # -- memory --

    def _memory_over(self) -> bool:
        members = self._members()
        tmp = self._tmp_used()
        quick = tmp + sum(_anon_bytes(pid) for pid in members)
        if quick <= self.watch.memory_bytes:
            return False
        # Over by the resident anonymous memory of each process: pages shared after a fork
        # count in each. Their proportional share (PSS) decides.
        held = sum(_pss_anon_bytes(pid) for pid in members)
        if held + tmp <= self.watch.memory_bytes:
            return False
        self.detail = (
            f"it used {_size(held + tmp)} of memory (its {len(members)} processes "
            f"{_size(held)}, /tmp and /dev/shm {_size(tmp)}), over the limit of "
            f"{_size(self.watch.memory_bytes)} for one command (all its processes and its /tmp "
            "together); it was killed. Use less at once: fewer parallel jobs, smaller inputs, "
            "less in /tmp"
        )
        return True

    def _members(self) -> list[int]:
        if not self.sandboxed:
            return _descendants(self.root)
        if not self.namespace and not self._read_info():
            return []
        found = []
        with os.scandir("/proc") as entries:
            for entry in entries:
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        if Path(entry.path, "ns", "pid").readlink().name == self.namespace:
                            found.append(int(entry.name))
        return found

    def _read_info(self) -> bool:
        """Bubblewrap's report of its init's pid and PID namespace (written once it started)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.info_fd, 4096):
                self.info += chunk
        namespace = re.search(rb'"pid-namespace":\s*(\d+)\s*[,}\n]', self.info)
        child = re.search(rb'"child-pid":\s*(\d+)\s*[,}\n]', self.info)
        if namespace is None or child is None:
            return False
        self.namespace = f"pid:[{namespace.group(1).decode()}]"
        self.init_pid = int(child.group(1))
        return True

    def _tmp_used(self) -> int:
        if not self.sandboxed or not self.init_pid:
            return 0
        used = 0
        for folder in self.tmpfs:
            with contextlib.suppress(OSError):
                # The sandbox's own mounts, seen through its init's root.
                st = os.statvfs(f"/proc/{self.init_pid}/root{folder}")
                used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used

    # -- worktree --

    def _walk(self) -> tuple[int, int]:
        assert self.watch.worktree is not None
        started = time.monotonic()
        usage = _worktree_usage(self.watch.worktree, self.watch.skip)
        # Walked again after at least a second, and after twenty times what a walk costs: a
        # large tree is watched less often rather than taking a core.
        took = time.monotonic() - started
        self.tree_due = time.monotonic() + max(1.0, 20 * took)
        return usage

    def _worktree_over(self) -> bool:
        size, files = self._walk()
        base_size, base_files = self.base
        over = []
        if files > self.watch.worktree_files and files > base_files:
            over.append(
                f"{files:,} files and folders (limit {self.watch.worktree_files:,}; "
                f"{files - base_files:+,} by this command)"
            )
        if size > self.watch.worktree_bytes and size > base_size:
            over.append(
                f"{_size(size)} (limit {_size(self.watch.worktree_bytes)}; "
                f"+{_size(size - base_size)} by this command)"
            )
        if not over:
            return False
        self.detail = (
            f"its worktree holds {' and '.join(over)}; the command was stopped. Delete what "
            "it made that does not belong in the change (downloads, build outputs, generated "
            "data) before going on"
        )
        return True


def _anon_bytes(pid: int) -> int:
    """Resident memory of a process that is neither a file's nor shared memory's."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_bytes().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _pss_anon_bytes(pid: int) -> int:
    """A process's proportional share of the anonymous pages it maps."""
    try:
        with Path(f"/proc/{pid}/smaps_rollup").open("rb") as handle:
            for line in handle:
                if line.startswith(b"Pss_Anon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return _anon_bytes(pid)


def _descendants(root: int) -> list[int]:
    """The process and every process below it (a process that left the tree is not found)."""
    children: dict[int, list[int]] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                data = Path(entry.path, "stat").read_bytes()
                ppid = int(data[data.rindex(b")") + 2 :].split(maxsplit=2)[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _worktree_usage(root: Path, skip: Sequence[Path]) -> tuple[int, int]:
    """(bytes, entries) below `root`: the apparent size of its files, the count of its files,
    folders and links, `skip` left out."""
    size = count = 0

    def visit(fd: int, entry: os.DirEntry[str]) -> None:
        nonlocal size, count
        count += 1
        if entry.is_file(follow_symlinks=False):
            size += entry.stat(follow_symlinks=False).st_size

    _walk_beneath(root, skip=skip, visit=visit)
    return size, count


def _walk_beneath(
    root: Path, *, skip: Sequence[Path], visit: Callable[[int, os.DirEntry[str]], None]
) -> None:
    """Call `visit(folder_fd, entry)` for every entry below `root` (`skip` left out, with what
    is in it). Walked through folder descriptors, each opened from its parent's without
    following links: a folder swapped for a link meanwhile (a command of the sandbox runs while
    the worker walks) is not followed out of the tree. Depth first, one open folder per level.
    `root` and `skip` are resolved paths."""
    skipped = {str(path) for path in skip}

    def scan(fd: int, path: str) -> list[str]:
        folders = []
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if f"{path}/{entry.name}" in skipped:
                    continue
                with contextlib.suppress(OSError):
                    visit(fd, entry)
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.name)
        return folders

    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return
    stack = [(top, str(root), iter(scan(top, str(root))))]
    while stack:
        fd, path, names = stack[-1]
        name = next(names, None)
        if name is None:
            os.close(fd)
            stack.pop()
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue
        stack.append((child, f"{path}/{name}", iter(scan(child, f"{path}/{name}"))))


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group; bubblewrap's --die-with-parent and the PID namespace take
    whatever inside escaped the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def workspace_own(path: Path, *, quantum_id: int) -> None:
    """Hand a workspace's files to the quantum's sandbox user (a root worker only). Its `.git`
    pointer stays root's; the runtime's git works on it with `safe.directory`."""
    if settings.SANDBOX_MODE == "off":
        return
    uid = _uid_no_connection_kept(quantum_id)
    if uid is not None:
        _own(path, uid)


def _own(path: Path, uid: int) -> None:
    """Everything below `path` but its `.git` (the worktree's pointer, or the shared tree's git
    folder), and `path` itself, to `uid`: through folder descriptors, each entry changed where
    it is, never through a link (a command of the quantum may swap a folder for a link)."""
    tree_chown(path, uid, skip_top=frozenset({".git"}))


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
    installation_register()
    _git_config_folder().mkdir(parents=True, exist_ok=True)
    probe = (Path(home) / "sandbox-probe").resolve()
    probe.mkdir(parents=True, exist_ok=True)
    uid = _probe_uid()
    if uid is not None:
        _own(probe, uid)
    try:
        result = _execute(
            shell_argv("echo ok > probe && cat probe", 10),
            cwd=probe,
            env=_environment(probe, {}),
            timeout_s=10,
            sandboxed=True,
            box=_Box(probe, uid),
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
