"""The one way the project runs git outside the sandbox: immune to what a repository's files say.

Every git process of the runtime (worktrees, commits, remote mode's fetch and push), the change
review, the merge queue, the scanners and goal verification runs through `git_command` (or
`git_run` / `git` on top of it). Agents write the files of the trees these processes work in, so
nothing in a tree may configure git. git takes configuration, and the programs it runs, from:

- the system file (`/etc/gitconfig`): not read (`GIT_CONFIG_NOSYSTEM=1`);
- the global files (`$HOME/.gitconfig`, `$XDG_CONFIG_HOME/git/config`): git reads
  `GIT_CONFIG_GLOBAL` instead, `ANNIHILATION_HOME/git/config`, a file the project writes; `HOME`
  and `XDG_CONFIG_HOME` are `ANNIHILATION_HOME/git/home`, an empty folder of the project's
  that no sandbox can write (every sandbox mounts the data folder empty). With `HOME` a
  worktree, a committed `.gitconfig` or `.config/git/config` would be git's global
  configuration;
- the repository's `.git/config` and a worktree's `config.worktree`: the operator's. The sandbox
  mounts every git folder a workspace uses read-only, and a worktree's `.git` pointer too, so
  no agent writes them or points a worktree at a git folder of its own;
- the environment: every inherited `GIT_*` variable is dropped (`GIT_DIR`, `GIT_CONFIG_*`,
  `GIT_EXEC_PATH` ... would redirect git), but the few that carry the operator's credentials
  for a central repository (`GIT_SSH_COMMAND`, `GIT_SSH`, `GIT_SSH_VARIANT`, `GIT_ASKPASS`);
- the command line: the `-c` settings below, which come last and win over every file.

The `-c` settings, each against a way a tree could make git run a program or reach out:
- `core.hooksPath=/dev/null`: no hook runs (git's own `hooks/` nor a configured folder);
- `core.fsmonitor=false`: no file-system monitor program;
- `core.attributesFile=/dev/null` and `GIT_ATTR_NOSYSTEM=1`: attributes come only from the
  tree's `.gitattributes`, which can name a filter, diff or merge driver, but a driver is a
  program only when configuration defines it (`filter.<name>.clean`, `diff.<name>.textconv`,
  `merge.<name>.driver`), and configuration comes only from the sources above. `diff`, `log`,
  `show` and `blame` also get `--no-ext-diff --no-textconv`, which win over any setting;
- `protocol.allow=never` but `file`, `git`, `ssh`, `http` and `https` (the schemes
  ANNIHILATION_REPO accepts), and `protocol.ext.allow=never`, `protocol.fd.allow=never` (a
  protocol's own setting would win over `protocol.allow`): no `ext::` transport, which runs a
  command;
- `submodule.recurse=false`, `fetch.recurseSubmodules=false`, `push.recurseSubmodules=no`, and
  `--no-recurse-submodules` on `fetch` and `pull`, `--recurse-submodules=no` on `push`: a
  committed `.gitmodules` never makes git fetch, push or check anything out; `diff` and
  `status` get `--ignore-submodules=dirty` (no `git status` inside a submodule's folder, where a
  repository an agent made would bring its own configuration), and `git add` and `git stash`,
  which take no such option, get `submodules_left_out`;
- `commit.gpgSign=false`, `tag.gpgSign=false`, `log.showSignature=false`: no signing program;
- `maintenance.auto=false`: git's automatic gc prunes worktrees, which must not race with
  `worktree add` (workspaces.registry_lock); the runtime runs maintenance itself, under a lock;
- `safe.directory`: only for the project's own trees, never `*`. A worktree belongs to its
  quantum's sandbox user when the worker is root, and git refuses a tree another user owns
  unless told it is safe: it is told so for the target repository itself (the shared mode
  gives it to quantum 0's user) and for a worktree whose `.git` pointer leads into the target
  repository's `worktrees/` folder, and for nothing else (a git folder an agent made inside
  its tree, with a configuration of its own, is refused).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from psychonauts.errors import WorkspaceError
from repos.context import current

logger = logging.getLogger(__name__)

__all__ = [
    "PSYCHONAUT",
    "TETHER",
    "GitCommand",
    "Identity",
    "git",
    "git_command",
    "git_run",
    "submodules_left_out",
]


@dataclass(frozen=True)
class Identity:
    """Who git records as author and committer (no configuration file names anyone)."""

    name: str
    email: str


PSYCHONAUT = Identity("Annihilation", "psychonaut@annihilation.invalid")
TETHER = Identity("Annihilation Tether", "tether@annihilation.invalid")

# The operator's ways of giving git credentials for a central repository: kept from the
# worker's environment. Every other GIT_* variable is dropped.
_PASSED_GIT_VARIABLES = frozenset({"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS"})

_PROTOCOLS = ("file", "git", "ssh", "http", "https")

_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.attributesFile", "/dev/null"),
    ("protocol.allow", "never"),
    *((f"protocol.{name}.allow", "always") for name in _PROTOCOLS),
    # A protocol's own setting wins over `protocol.allow`, in any file: these two run commands.
    ("protocol.ext.allow", "never"),
    ("protocol.fd.allow", "never"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("maintenance.auto", "false"),
)

# Options after a subcommand that win over any setting of any file: no external diff program or
# textconv filter for those that diff, no submodule recursion for those that talk to a remote (a
# `.gitmodules` entry's own `fetchRecurseSubmodules` would win over `fetch.recurseSubmodules`).
_NO_PROGRAMS = {
    **dict.fromkeys(("log", "show", "blame"), ("--no-ext-diff", "--no-textconv")),
    # Besides: never `git status` inside a submodule's folder (its own configuration would
    # apply), whatever `.gitmodules` says (its `ignore = none` wins over any setting).
    "diff": ("--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty"),
    "status": ("--ignore-submodules=dirty",),
    "fetch": ("--no-recurse-submodules",),
    "pull": ("--no-recurse-submodules",),
    "push": ("--recurse-submodules=no",),
}

_GLOBAL_CONFIG = """\
# git's global configuration for every git process Annihilation runs (psychonauts/workspaces/git.py).
# Written by Annihilation; it holds no setting: what git must not do is given on each command
# line, where it wins over every file.
"""


@dataclass(frozen=True)
class GitCommand:
    """A git command line and the environment it runs in, for `subprocess`."""

    argv: list[str]
    env: dict[str, str]


_home_lock = threading.Lock()
_homes_written: set[Path] = set()


def _home_ensure(folder: Path) -> tuple[Path, Path]:
    """(HOME, the global configuration file) under `folder`: written once per process, made
    again when deleted (a test's data folder)."""
    home, config = folder / "home", folder / "config"
    if folder in _homes_written and config.exists():
        return home, config
    with _home_lock:
        home.mkdir(parents=True, exist_ok=True)
        try:
            current = config.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != _GLOBAL_CONFIG:
            # Aside and renamed: a concurrent git reads the old file or the new one.
            aside = folder / f"config.{os.getpid()}.{threading.get_native_id()}"
            aside.write_text(_GLOBAL_CONFIG, encoding="utf-8")
            aside.replace(config)
        _homes_written.add(folder)
        return home, config


def _project_repository() -> Path:
    """The local repository the project's git works in: the current repository (repos.context;
    the default one is ANNIHILATION_REPO), or this host's clone of its central repository,
    without making the clone."""
    target = current()
    if not target.url:
        return Path(target.location)
    return target.clone


def _toplevel(cwd: Path) -> Path | None:
    """The folder holding the `.git` that git would find from `cwd` (its own discovery,
    without a process), resolved as git sees it."""
    here = cwd.resolve()
    for folder in (here, *here.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def _safe_directories(cwd: Path) -> list[str]:
    """`safe.directory` values for a command run in `cwd`: its tree when it is the project's
    repository or one of that repository's worktrees, else none."""
    top = _toplevel(cwd)
    if top is None:
        return []
    try:
        repo = _project_repository().resolve()
    except OSError:
        return []
    if top == repo:
        return [str(top)]
    dot_git = top / ".git"
    if not dot_git.is_file() or dot_git.is_symlink():
        return []
    try:
        line = dot_git.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return []
    if not line.startswith("gitdir:"):
        return []
    pointed = (top / line.removeprefix("gitdir:").strip()).resolve()
    registry = repo / ".git" / "worktrees"
    if pointed.parent == registry.resolve():
        return [str(top)]
    return []


def git_command(
    *args: str,
    cwd: Path,
    identity: Identity = PSYCHONAUT,
    author: str = "",
    index_file: Path | None = None,
) -> GitCommand:
    """The hardened command line and environment of `git <args>` run in `cwd` (see the module's
    docstring). `author`: the author's name when it is not the identity's; `index_file`: a
    private index instead of the worktree's own."""
    home, config = _home_ensure(Path(settings.ANNIHILATION_HOME) / "git")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_") or key in _PASSED_GIT_VARIABLES
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=str(config),
        GIT_ATTR_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME=author or identity.name,
        GIT_AUTHOR_EMAIL=identity.email,
        GIT_COMMITTER_NAME=identity.name,
        GIT_COMMITTER_EMAIL=identity.email,
    )
    if index_file is not None:
        env["GIT_INDEX_FILE"] = str(index_file)
    argv = ["git"]
    for key, value in _OVERRIDES:
        argv += ["-c", f"{key}={value}"]
    for folder in _safe_directories(cwd):
        argv += ["-c", f"safe.directory={folder}"]
    argv += _with_no_programs(args)
    return GitCommand(argv=argv, env=env)


def _with_no_programs(args: Sequence[str]) -> list[str]:
    """`args` with the subcommand's `_NO_PROGRAMS` options after it (the caller's own leading
    `-c key=value` pairs skipped)."""
    rest = list(args)
    at = 0
    while at < len(rest) - 1 and rest[at] == "-c":
        at += 2
    if at < len(rest) and rest[at] in _NO_PROGRAMS:
        rest[at + 1 : at + 1] = _NO_PROGRAMS[rest[at]]
    return rest


def submodules_left_out(workspace: Path, *, index_file: Path | None = None) -> list[str]:
    """Pathspecs that leave out each submodule of the worktree's index whose folder holds a
    repository (one an agent made: its configuration is the agent's). `git add` and `git
    stash` run `git status` inside a submodule's folder, with that repository's configuration
    and attributes (its filters), and take no option against it: they get these instead."""
    listing = git_run("ls-files", "--stage", "-z", cwd=workspace, index_file=index_file)
    specs: list[str] = []
    for entry in listing.stdout.split("\0") if listing.returncode == 0 else ():
        meta, _, path = entry.partition("\t")
        if meta.startswith("160000 ") and os.path.lexists(workspace / path / ".git"):
            specs.append(f":(top,literal,exclude){path}")
    return specs


def git_run(
    *args: str,
    cwd: Path,
    identity: Identity = PSYCHONAUT,
    author: str = "",
    index_file: Path | None = None,
    timeout: float | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`git <args>` in `cwd`, hardened (`git_command`); the caller reads the exit status."""
    command = git_command(*args, cwd=cwd, identity=identity, author=author, index_file=index_file)
    return subprocess.run(
        command.argv,
        cwd=cwd,
        env=command.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        input=input,
    )


def git(*args: str, cwd: Path, identity: Identity = PSYCHONAUT, author: str = "") -> str:
    """git's output, or WorkspaceError naming the command and git's complaint."""
    proc = git_run(*args, cwd=cwd, identity=identity, author=author)
    if proc.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def transient(proc: subprocess.CompletedProcess[str]) -> bool:
    """A failure worth retrying: the network or the server, or a ref lock another process of
    this host held for a moment; not a refusal (a push's porcelain lines) or a missing ref."""
    text = proc.stderr.lower()
    if "couldn't find remote ref" in text or "[rejected]" in proc.stdout or "atomic push" in text:
        return False
    return any(
        s in text
        for s in (
            "unable to connect",
            "could not read from remote",
            "connection",
            "timed out",
            "the remote end hung up",
            "early eof",
            "cannot lock ref",
            "unable to access",
            "could not resolve host",
            "temporary failure",
            "broken pipe",
            "network is unreachable",
            "no route to host",
        )
    )


def network_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A git command that talks to the central repository, retried with backoff through
    network failures for ANNIHILATION_CENTRAL_RETRY_S; its last run (the caller reads it)."""
    budget = float(getattr(settings, "ANNIHILATION_CENTRAL_RETRY_S", 60.0))
    deadline = time.monotonic() + budget
    delay = 0.2
    while True:
        try:
            proc = git_run(*args, cwd=cwd, timeout=max(budget, 10.0))
        except subprocess.TimeoutExpired as exc:  # a connection that hangs (a partition)
            proc = subprocess.CompletedProcess(list(args), 128, "", f"timed out: {exc}")
        if proc.returncode == 0 or not transient(proc) or time.monotonic() + delay > deadline:
            return proc
        logger.warning(
            "central repository unreachable (git %s), retrying: %s",
            args[0], proc.stderr.strip()[-200:],
        )  # fmt: skip
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def network(*args: str, cwd: Path) -> str:
    """`network_run`, its output; WorkspaceError naming git's complaint when it failed."""
    proc = network_run(*args, cwd=cwd)
    if proc.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args[:2])} failed in {cwd}: {proc.stderr.strip()[-600:]}"
        )
    return proc.stdout.strip()
