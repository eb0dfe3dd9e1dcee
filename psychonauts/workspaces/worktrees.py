"""Workspaces: a git worktree per quantum on branch `annihilation/q-<id>` (or one shared tree).

git state is changed under a file lock (fcntl): fan-out agents of one quantum share a worktree,
and two `git worktree add` or `git commit` at once would race on git's own index lock.

Everything here works on the current repository (repos.context: a quantum's own, the default
one being ANNIHILATION_REPO). Its location may be a central repository's URL: worktrees then
come from this host's clone of it, a stage fetches its branch first and each commit is pushed,
fenced (central.py). `repository.repo_local()` is the repository git runs in, in either mode.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import os
import re
import shutil
import stat
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

from django.conf import settings

from psychonauts.containment.sandbox import workspace_own
from psychonauts.errors import PathEscape, WorkspaceError
from psychonauts.workspaces.central import (
    Fence,
    commit_land,
    fence_take,
    quantum_lock,
    worktree_start,
    worktree_sync,
)
from psychonauts.workspaces.excludes import add_all_args, excludes_file
from psychonauts.workspaces.git import git, git_run
from psychonauts.workspaces.repository import (
    branch_for,
    file_lock,
    registry_lock,
    repo_local,
    repo_url,
    stripe,
)
from repos.context import working_on_quantum

_DEMO_FILES = {
    ".gitignore": "__pycache__/\n*.pyc\n.pytest_cache/\n",
    "README.md": (
        "# calc\n\nA small calculator for Annihilation's demo: calc.py (add; subtract and divide"
        " are its TODO) and its test, `python3 -m pytest -q`.\n"
    ),
    "calc.py": (
        '"""A tiny calculator the demo agents work on."""\n\n\n'
        "def add(a: int, b: int) -> int:\n    return a + b\n\n\n"
        "# TODO: subtract and divide, with a clear error for a zero divisor.\n"
    ),
    "test_calc.py": (
        "from calc import add\n\n\ndef test_add() -> None:\n    assert add(2, 2) == 4\n"
    ),
}


def demo_repo_ensure(path: Path) -> Path:
    """Create a small git repository at `path` unless one is already there."""
    path = Path(path)
    if (path / ".git").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "-b", "main", cwd=path)
    for name, text in _DEMO_FILES.items():
        (path / name).write_text(text, encoding="utf-8")
    git("add", "-A", cwd=path)
    git("commit", "-q", "-m", "demo: initial commit", cwd=path)
    return path


def scratch_worktree(where: Path, sha: str) -> Path:
    """A worktree of the target repository at `where` for the runtime's own checks (never an
    agent's), detached at `sha` and clean: made when missing, else reset, so whatever its last
    user left is gone. Its caller holds a lock that keeps others out of `where`."""
    repo = repo_local()
    if not (where / ".git").exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        with registry_lock(shared=False):  # a stale record of a deleted folder is pruned first
            git("worktree", "prune", cwd=repo)
            if where.exists():
                git_run("worktree", "remove", "--force", str(where), cwd=repo)
            git("worktree", "add", "-q", "--detach", str(where), sha, cwd=repo)
        return where
    git("checkout", "-q", "-f", "--detach", sha, cwd=where)
    git("clean", "-q", "-ffdx", cwd=where)
    return where


def _worktree_args(repo: Path, path: Path, branch: str) -> list[str]:
    """`git worktree add` arguments: check out the branch if it exists, else create it."""
    exists = git_run("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=repo)
    return [str(path), branch] if exists.returncode == 0 else ["-b", branch, str(path), "HEAD"]


@functools.cache
def _plain_checkout(repo: Path) -> bool:
    """Whether a checkout in `repo` is only a checkout: its git folder is `.git` (no hook runs:
    psychonauts/workspaces/git.py)."""
    return (repo / ".git").is_dir()


def _worktree_add_new(repo: Path, path: Path, branch: str, start: str = "HEAD") -> None:
    """`git worktree add -b <branch> <path> HEAD` in one small git process instead of git's
    four. Its command reads the records of every registered worktree three times over (a branch
    must not be out in two of them): a hundred agents adding theirs at once spent more
    system CPU on that than on anything else (bench/agents_concurrency.py). A new branch is out nowhere, so its
    record is written here as git writes one (gitrepository-layout(5), `worktrees/<id>`: locked
    while being made), with the repository's HEAD as its own, and `git checkout -f -b` makes the
    branch there and checks it out. WorkspaceError when the branch exists or anything is in the
    way, with nothing of the attempt left: the caller then takes git's own command. `start`:
    where the branch starts (a central tip in remote mode)."""
    if not _plain_checkout(repo):
        git("worktree", "add", "-q", "-b", branch, str(path), start, cwd=repo)
        return
    path = path.resolve()
    record = (repo / ".git" / "worktrees" / path.name).resolve()
    made: list[Path] = []
    try:
        head = (repo / ".git" / "HEAD").read_text()
        record.parent.mkdir(exist_ok=True)
        record.mkdir()
        made.append(record)
        (record / "locked").write_text("initializing\n")
        path.mkdir()
        made.append(path)
        (path / ".git").write_text(f"gitdir: {record}\n")
        (record / "commondir").write_text("../..\n")
        (record / "HEAD").write_text(head)
        (record / "gitdir").write_text(f"{path / '.git'}\n")
        # -b refuses a branch that exists: a quantum's earlier work is never reset.
        git(
            *("checkout", "--quiet", "--force", "-b", branch),
            *((start,) if start != "HEAD" else ()),
            cwd=path,
        )
        (record / "locked").unlink()
    except (OSError, WorkspaceError) as exc:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        raise WorkspaceError(f"adding the worktree {path} failed: {exc}") from exc


def workspace_ensure(*, quantum_id: int) -> Path:
    """The working tree for a quantum's agents (created on first use, reused afterwards). With
    a central repository: created at its branch's central tip, or brought to it when present."""
    remote = repo_url()
    repo = repo_local()
    if not (repo / ".git").exists():
        raise WorkspaceError(
            f"ANNIHILATION_REPO={repo} is not a git repository "
            "(the demo creates one: psychonauts.workspaces.worktrees.demo_repo_ensure)"
        )
    if settings.PSYCHONAUTS_WORKSPACE_MODE == "shared":
        if remote:
            raise WorkspaceError(
                "the shared workspace mode needs a local ANNIHILATION_REPO, not a URL"
            )
        _shared_own(repo.resolve())
        return repo
    path = Path(settings.PSYCHONAUTS_WORKTREES) / f"q-{quantum_id}"
    if remote:
        if (path / ".git").exists():
            worktree_sync(path, quantum_id=quantum_id)
            return path
        return _worktree_create(repo, path, quantum_id, worktree_start(quantum_id))
    if (path / ".git").exists():
        return path
    return _worktree_create(repo, path, quantum_id, "HEAD")


def _worktree_create(repo: Path, path: Path, quantum_id: int, start: str) -> Path:
    """The quantum's worktree made at `start` ("HEAD": the repository's own; in remote mode the
    central tip, and an older local branch of the same name is reset to it)."""
    # Per quantum (its stripe): agents of one quantum wait for each other, other quanta go on in
    # parallel (git takes its own lock on each new branch ref).
    with file_lock(f"worktree-{stripe(quantum_id)}"):
        if (path / ".git").exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        branch = branch_for(quantum_id)
        try:
            # The common case: a new branch from HEAD.
            with registry_lock(shared=True):
                _worktree_add_new(repo, path, branch, start)
        except WorkspaceError:
            # The branch exists (an earlier run of the quantum), or a worktree folder deleted by
            # hand is still registered: prune, look at the branch, retry once.
            with registry_lock(shared=False):
                git("worktree", "prune", cwd=repo)
                args = (
                    _worktree_args(repo, path, branch)
                    if start == "HEAD"
                    else ["-B", branch, str(path), start]
                )
                git("worktree", "add", "-q", *args, cwd=repo)
        workspace_own(path, quantum_id=quantum_id)
    return path


@functools.cache
def _shared_own(repo: Path) -> None:
    """The shared tree is every agent's: its files go to the sandbox user of quantum 0."""
    workspace_own(repo, quantum_id=0)


# Worktrees are made at a lower CPU priority than the agents' own work: a hundred agents starting
# at once need the cores for their first model calls (and the worker for taking their tasks),
# while a worktree is needed only at the first tool call, a model call later. In
# bench/agents_concurrency.py the last of 100 agents started 1.0-1.1 s into the batch with this,
# 1.5-2.5 s without.
PREPARE_NICE = 10


def _prepare_thread_start() -> None:
    """On Linux a priority is a thread's own, and the processes it starts inherit it: this
    thread and its git run PREPARE_NICE lower, the rest of the process as it was."""
    if sys.platform == "linux":
        with suppress(OSError):
            thread = threading.get_native_id()
            niceness = os.getpriority(os.PRIO_PROCESS, thread) + PREPARE_NICE
            os.setpriority(os.PRIO_PROCESS, thread, min(niceness, 19))


class _Preparer:
    """A few threads per process that create worktrees ahead of their agents' first tool call
    (re-created in a forked child, which inherits the pool but not its threads)."""

    _lock = threading.Lock()
    _pool: tuple[int, ThreadPoolExecutor] | None = None

    @classmethod
    def pool(cls) -> ThreadPoolExecutor:
        with cls._lock:
            if cls._pool is None or cls._pool[0] != os.getpid():
                # git's checkout is CPU work: a hundred at once would only queue for the cores.
                workers = 2 * (os.cpu_count() or 1)
                pool = ThreadPoolExecutor(
                    workers, "workspace-prepare", initializer=_prepare_thread_start
                )
                cls._pool = (os.getpid(), pool)
            return cls._pool[1]


def workspace_prepare(*, quantum_id: int, fence: Fence | None = None) -> Future[Path]:
    """`workspace_ensure` in the background: an agent's first model call need not wait for its
    worktree. A hundred agents starting at once would wait for git otherwise
    (bench/agents_concurrency.py); this way git works while the model does. `fence` (remote
    mode): the execution takes its agent's fence first, so what it fetches next is all that
    earlier executions of the agent could still push."""
    # In the caller's context: the pool's thread works on the caller's repository.
    return _Preparer.pool().submit(contextvars.copy_context().run, _prepare, quantum_id, fence)


def _prepare(quantum_id: int, fence: Fence | None) -> Path:
    if fence is not None and repo_url():
        fence_take(fence)
    return workspace_ensure(quantum_id=quantum_id)


def workspace_ready(prepared: Future[Path], *, quantum_id: int, fence: Fence | None = None) -> Path:
    """The worktree `workspace_prepare` was asked for. Not begun yet when it is needed (the
    background threads run niced, and on a busy machine the queue before them is long): made
    here, at the asking thread's priority."""
    if prepared.cancel():
        return _prepare(quantum_id, fence)
    return prepared.result()


def workspace_remove(*, quantum_id: int) -> bool:
    """Remove a quantum's worktree from its repository; False when it had none. Its branch
    stays: reviews and merges read the branch, and a later run of the quantum checks it out
    again."""
    with working_on_quantum(quantum_id):
        return _workspace_remove(quantum_id)


def _workspace_remove(quantum_id: int) -> bool:
    path = Path(settings.PSYCHONAUTS_WORKTREES) / f"q-{quantum_id}"
    repo = repo_local()
    with file_lock(f"worktree-{stripe(quantum_id)}"):
        if not path.exists():
            return False
        try:
            with registry_lock(shared=True):
                git("worktree", "remove", "--force", str(path), cwd=repo)
        except WorkspaceError:
            # A folder git no longer knows as a worktree (registered elsewhere, or by hand).
            shutil.rmtree(path)
            with registry_lock(shared=False):
                git("worktree", "prune", cwd=repo)
    return True


_COMMIT_SUMMARY = re.compile(r"^\[[^\]]* ([0-9a-f]{40})\]")


def workspace_left_out(workspace: Path, *, limit: int = 200) -> list[str]:
    """The untracked files the runtime's commit leaves out of the worktree (ignored by the
    repository's .gitignore or the exclude list), folders collapsed to one entry, at most
    `limit` of them. [] when the worktree is gone."""
    if not (workspace / ".git").exists():
        return []
    proc = git_run(
        *("-c", f"core.excludesFile={excludes_file(workspace)}"),
        *("ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"),
        cwd=workspace,
    )
    if proc.returncode != 0:
        return []
    return sorted(p for p in proc.stdout.split("\0") if p)[:limit]


def workspace_uncommitted(workspace: Path) -> list[str]:
    """The paths whose content is not in the worktree's HEAD commit: changed, removed or new
    files the runtime's commit would take (generated files it leaves out are not listed)."""
    out = git(
        *("-c", f"core.excludesFile={excludes_file(workspace)}"),
        *("status", "--porcelain", "-z", "--untracked-files=all"),
        cwd=workspace,
    )
    paths = []
    for entry in out.split("\0"):
        if len(entry) > 3 and entry[2] == " ":
            paths.append(entry[3:])
    return sorted(paths)


def workspace_discard(workspace: Path, *, quantum_id: int) -> list[str]:
    """Bring the worktree back to its branch tip: what is not committed (changed, removed or
    new, but the generated files the commit leaves out) is discarded. Returns the paths
    discarded ([] when the worktree was clean)."""
    left = workspace_uncommitted(workspace)
    if not left:
        return []
    exclude = f"core.excludesFile={excludes_file(workspace)}"
    with file_lock(f"commit-{stripe(str(workspace.resolve()))}"):
        git("reset", "-q", "--hard", "HEAD", cwd=workspace)
        git("-c", exclude, "clean", "-q", "-f", "-d", cwd=workspace)
    # Files git wrote back are the runtime's: hand them to the quantum's sandbox user again.
    workspace_own(workspace, quantum_id=quantum_id)
    return left


def worktree_path(quantum_id: int) -> Path:
    """Where a quantum's worktree is (or would be); the target repository in shared mode."""
    if settings.PSYCHONAUTS_WORKSPACE_MODE == "shared":
        return repo_local()
    return Path(settings.PSYCHONAUTS_WORKTREES) / f"q-{quantum_id}"


def workspace_commit(
    *, workspace: Path, quantum_id: int, agent_id: str, role: str, fence: Fence | None = None
) -> str:
    """Commit everything the agent changed but generated files (COMMIT_EXCLUDES and the
    repository's .gitignore); returns the commit sha, or "" when nothing changed.

    With a central repository the commit is pushed to the quantum's central branch under the
    quantum's lock across hosts (replayed on the tip another host pushed meanwhile), fenced by
    the execution's `fence`; the sha returned is the one that landed there. StaleExecution
    (nothing pushed) when another execution holds the agent now."""
    if not repo_url():
        return _commit(workspace, quantum_id, agent_id, role)
    from core.locks import LockUnavailable

    try:
        with quantum_lock(quantum_id):
            sha = _commit(workspace, quantum_id, agent_id, role)
            if not sha:
                return ""
            return commit_land(
                workspace=workspace,
                quantum_id=quantum_id,
                fence=fence,
                commit=sha,
                author=f"psychonaut {agent_id}",
                message=commit_message(quantum_id, agent_id, role),
            )
    except LockUnavailable as exc:
        raise WorkspaceError(f"q-{quantum_id}: no push: {exc}") from exc


def commit_message(quantum_id: int, agent_id: str, role: str) -> str:
    """The subject of an agent's commit (how its commit is found on a branch)."""
    return f"q-{quantum_id}: {agent_id} ({role})"


def _commit(workspace: Path, quantum_id: int, agent_id: str, role: str) -> str:
    with file_lock(f"commit-{stripe(str(workspace.resolve()))}"):
        exclude = f"core.excludesFile={excludes_file(workspace)}"
        git(*add_all_args(workspace), cwd=workspace)
        try:
            # core.abbrev=40: the summary line carries the full sha, saving a rev-parse.
            summary = git(
                "-c",
                exclude,
                "-c",
                "core.abbrev=40",
                "commit",
                "-m",
                commit_message(quantum_id, agent_id, role),
                cwd=workspace,
                author=f"psychonaut {agent_id}",
            )
        except WorkspaceError:
            # Asking first would cost a subprocess on every commit; ask only when it failed.
            unchanged = git_run("diff", "--cached", "--quiet", cwd=workspace).returncode
            if unchanged == 0:
                return ""
            raise
        _maintain(workspace)
        # "[annihilation/q-7 (root-commit) <sha>] message"
        found = _COMMIT_SUMMARY.match(summary)
        return found.group(1) if found else git("rev-parse", "HEAD", cwd=workspace)


MAINTENANCE_EVERY = 50
_commits = itertools.count(1)


def _maintain(workspace: Path) -> None:
    """git's automatic maintenance (packing loose objects), once per MAINTENANCE_EVERY commits
    of this process rather than after every one (after each, it would be a process of its own):
    all worktrees share the repository's store."""
    if next(_commits) % MAINTENANCE_EVERY == 0:
        with registry_lock(shared=False):
            git("maintenance", "run", "--auto", "--quiet", cwd=workspace)


def resolve_path(workspace: Path, relative: str) -> Path:
    """`relative` inside the workspace, or PathEscape: absolute paths, `..`, symlinks out, .git."""
    if not relative or relative.startswith(("/", "~")) or "\x00" in relative:
        raise PathEscape(f"{relative!r}: use a path relative to the workspace")
    parts = Path(relative).parts
    if ".." in parts:
        raise PathEscape(f"{relative!r}: `..` leaves the workspace")
    if parts and parts[0] == ".git":
        raise PathEscape(f"{relative!r}: the .git folder is off limits")
    root = _real_root(workspace)
    target = root.joinpath(*parts)
    # Only a link inside the workspace can lead out: look at the path's own steps (not at every
    # folder above the workspace again, as resolving the whole path would).
    step = root
    for part in parts:
        step = step / part
        try:
            if stat.S_ISLNK(os.lstat(step).st_mode):
                break
        except (FileNotFoundError, NotADirectoryError):
            return target  # nothing below exists, so no link either
    else:
        return target
    target = target.resolve()
    if target != root and not target.is_relative_to(root):
        raise PathEscape(f"{relative!r}: resolves outside the workspace (symlink)")
    return target


@functools.lru_cache(maxsize=1024)
def _real_root(workspace: Path) -> Path:
    return workspace.resolve()
