"""The central repository: ANNIHILATION_REPO given as a URL, shared by workers on several hosts.

Two modes, by the form of the setting (validated and normalised in settings.py: a local path
is an absolute Path, a URL a str):
- a local path: git runs in that repository; nothing is fetched or pushed (one host);
- a URL (`ssh://`, `https://`, `git://`, `file://`, `user@host:path`): each host works in its
  own clone (ANNIHILATION_CLONE, made on first use), whose remote `origin` is the central
  repository. Its `refs/remotes/origin/<branch>` are the central branches as last fetched;
  the clone's own branches are the worktrees' (`annihilation/q-<id>`).

A stage fetches its quantum's branch before its agent starts, and the agent's commit is pushed
by one atomic push that names what it replaces (`--force-with-lease`): the branch's tip as
fetched, and the agent's fence. The fence is a ref per agent, `refs/annihilation/fence/<agent>`,
pointing at a blob unique to one execution: an execution writes a new one when it starts (it
holds the agent's lease, bursts/leases.py), and each push moves it on from the value the
execution wrote last. An execution taken over by another host (presumed dead, come back) finds
the fence moved: its push is refused whole, its commit dropped (StaleExecution), and a replay
of its push fails the same way. Pushes of one quantum are serialised across hosts by a Redis
lock (core/locks.py); git's compare-and-set is what protects the branch if that lock fails.

An agent that waits (on the Tether, on a budget) may be resumed on any host: before it lets go,
its uncommitted work is pushed as a commit to `refs/annihilation/wip/<agent>` and its fence
names that commit (`wip_save`); the execution that resumes it on another host reads the fence
and applies that work to its worktree (`wip_restore`).
"""

from __future__ import annotations

import logging
import re
import subprocess
import tempfile
import uuid
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from core.locks import RedisLock, redis_lock_try
from psychonauts.containment.sandbox import workspace_own
from psychonauts.errors import WorkspaceError
from psychonauts.workspaces.excludes import add_all_args
from psychonauts.workspaces.git import (
    git,
    git_command,
    git_run,
    network,
    network_run,
    submodules_left_out,
)
from psychonauts.workspaces.repository import (
    branch_for,
    file_lock,
    file_lock_try,
    repo_key,
    repo_local,
    repo_url,
    stripe,
)
from repos.context import current

logger = logging.getLogger(__name__)

REMOTE = "origin"
FENCE_PREFIX = "refs/annihilation/fence/"
WIP_PREFIX = "refs/annihilation/wip/"
# How many times a push whose branch moved under it (another host pushed between our fetch
# and our push, e.g. after the quantum's lock expired) is replayed on the new tip.
PUSH_RETRIES = 5
_SAFE_REF = re.compile(r"[^A-Za-z0-9._-]")


class StaleExecution(WorkspaceError):
    """This execution no longer holds its agent: another execution moved the agent's fence in
    the central repository (the run was taken over). Its commit was not pushed."""


class CentralConflict(WorkspaceError):
    """The agent's commit does not apply on the branch as another agent left it centrally."""


def tracking(branch: str) -> str:
    """The ref that holds a central branch as last fetched (the branch itself in local mode)."""
    return f"refs/remotes/{REMOTE}/{branch}" if repo_url() else branch


def base_branch() -> str:
    """The branch a quantum's new branch starts from, centrally: the current repository's
    target branch (the default one's: TETHER_TARGET_BRANCH), or the central repository's HEAD
    branch (as the clone recorded it)."""
    if current().target_branch:
        return current().target_branch
    repo = repo_local()
    found = git_run("symbolic-ref", "--short", f"refs/remotes/{REMOTE}/HEAD", cwd=repo)
    if found.returncode == 0:
        return found.stdout.strip().removeprefix(f"{REMOTE}/")
    return git("symbolic-ref", "--short", "HEAD", cwd=repo)


def fetch(branches: Iterable[str]) -> dict[str, str]:
    """Fetch central branches into their tracking refs: {branch: its sha, "" when the central
    repository has no such branch (its tracking ref is deleted)}. Local mode: {} and no git."""
    wanted = list(dict.fromkeys(b for b in branches if b))
    if not repo_url() or not wanted:
        return {}
    repo = repo_local()
    missing: list[str] = []
    present = list(wanted)
    while present:
        # One fetch for all; git refuses the whole fetch for one missing ref: drop it, again.
        specs = [f"+refs/heads/{b}:{tracking(b)}" for b in present]
        proc = network_run(
            "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", REMOTE, *specs, cwd=repo
        )
        if proc.returncode == 0:
            break
        gone = re.search(r"couldn't find remote ref refs/heads/(\S+)", proc.stderr)
        if gone is None or gone.group(1) not in present:
            raise WorkspaceError(f"git fetch failed in {repo}: {proc.stderr.strip()[-600:]}")
        present.remove(gone.group(1))
        missing.append(gone.group(1))
    for branch in missing:
        git_run("update-ref", "-d", tracking(branch), cwd=repo)
    tips = dict.fromkeys(wanted, "")
    if present:
        listing = git(
            "for-each-ref",
            "--format=%(objectname) %(refname)",
            *(tracking(b) for b in present),
            cwd=repo,
        )
        by_ref = {ref: sha for sha, ref in (line.split(" ", 1) for line in listing.splitlines())}
        for branch in present:
            tips[branch] = by_ref.get(tracking(branch), "")
    return tips


def fetch_or_last(branches: Iterable[str]) -> None:
    """`fetch` for a reader that can live with the last fetched state when the central
    repository is unreachable (a page, a review's look at a branch): logged, not raised.
    Whatever moves a branch afterwards does it by compare-and-set against the real tip."""
    try:
        fetch(branches)
    except WorkspaceError as exc:
        logger.warning("central repository not fetched, reading the last fetch: %s", exc)


def central_file(path: str, *, limit: int) -> bytes:
    """A file of the central base branch as this host last fetched it (at most `limit` bytes;
    b"" when absent): no network, for a reader on an agent's path."""
    repo = repo_local()
    command = git_command("cat-file", "blob", f"{tracking(base_branch())}:{path}", cwd=repo)
    proc = subprocess.run(command.argv, cwd=repo, env=command.env, capture_output=True, check=False)
    return proc.stdout[:limit] if proc.returncode == 0 else b""


# --- fences ---------------------------------------------------------------------------------
@dataclass
class Fence:
    """One execution's hold on its agent in the central repository: the blob its fence ref must
    point at for this execution's pushes to land. `sha` is "" until taken.

    `look_back` (a resumed run): taking the fence first reads the one it replaces:
    `previous_host` is the host of the execution that held the agent before ("" when none), and
    `previous_wip` the commit of uncommitted work it set aside when it let the agent wait ("" when
    it did not: it was cut off mid-work)."""

    agent_id: str
    note: str = ""
    look_back: bool = False
    host: str = field(default_factory=lambda: _this_host())
    sha: str = field(default="")
    previous_host: str = field(default="")
    previous_wip: str = field(default="")

    @property
    def ref(self) -> str:
        return fence_ref(self.agent_id)


def fence_ref(agent_id: str) -> str:
    return FENCE_PREFIX + _SAFE_REF.sub("_", agent_id)


def _this_host() -> str:
    return str(settings.ANNIHILATION_HOST)


def wip_ref(agent_id: str) -> str:
    return WIP_PREFIX + _SAFE_REF.sub("_", agent_id)


def _fence_blob(repo: Path, fence: Fence, *, wip: str = "") -> str:
    """A new object unique to this moment of this execution (a blob: nothing checks it out),
    naming its agent and host, and the work it set aside when it lets the agent wait."""
    text = f"agent {fence.agent_id}\nnote {fence.note}\nhost {fence.host}\nid {uuid.uuid4().hex}\n"
    if wip:
        text += f"wip {wip}\n"
    proc = git_run("hash-object", "-w", "--stdin", cwd=repo, input=text)
    if proc.returncode != 0:
        raise WorkspaceError(f"git hash-object failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def fence_take(fence: Fence) -> str:
    """Make this execution the agent's holder centrally: its fence ref now points at a new blob
    (forced: the agent's lease and the run's start compare-and-set already chose this one)."""
    repo = repo_local()
    if fence.look_back:
        fence.previous_host, fence.previous_wip = _fence_previous(repo, fence)
    blob = _fence_blob(repo, fence)
    network("push", "--quiet", "--force", REMOTE, f"{blob}:{fence.ref}", cwd=repo)
    fence.sha = blob
    return blob


def _fence_previous(repo: Path, fence: Fence) -> tuple[str, str]:
    """The host and the set-aside work named by the agent's fence as it is centrally ("" for
    what it does not name)."""
    seen = f"refs/annihilation/seen/{fence.ref.removeprefix(FENCE_PREFIX)}"
    proc = network_run(
        *("fetch", "--quiet", "--no-tags", "--no-write-fetch-head"),
        *(REMOTE, f"+{fence.ref}:{seen}"),
        cwd=repo,
    )
    if proc.returncode != 0:
        if "couldn't find remote ref" in proc.stderr:
            return "", ""
        raise WorkspaceError(f"git fetch of {fence.ref} failed: {proc.stderr.strip()[-600:]}")
    text = git("cat-file", "-p", seen, cwd=repo)
    host = re.search(r"^host (.*)$", text, re.MULTILINE)
    wip = re.search(r"^wip ([0-9a-f]{40,64})$", text, re.MULTILINE)
    return (host.group(1).strip() if host else "", wip.group(1) if wip else "")


# --- stage start ----------------------------------------------------------------------------
def worktree_start(quantum_id: int) -> str:
    """Where a quantum's new worktree starts on this host: its central branch's tip, or the
    base's when the branch has no commit yet. WorkspaceError when neither exists."""
    branch, base = branch_for(quantum_id), base_branch()
    tips = fetch([branch, base])
    start = tips.get(branch) or tips.get(base)
    if not start:
        raise WorkspaceError(f"the central repository {repo_url()} has neither {branch} nor {base}")
    return start


def worktree_sync(path: Path, *, quantum_id: int) -> None:
    """Bring an existing worktree to its branch's central tip: fast-forward when behind; reset
    to it when the local branch has commits the central one lacks (a push that was refused:
    that work was fenced out). Files a sibling agent of this host is still editing are kept:
    `merge --ff-only` and `reset --keep` refuse to overwrite them, and the worktree then stays
    where it is (the next commit is replayed on the central tip anyway)."""
    if _sync(path, quantum_id, reset=False):
        return
    # Ahead of the central tip: a sibling of this host may be between its commit and its push
    # (it holds the quantum's lock). Under the lock, only a refused push is left to undo.
    with quantum_lock(quantum_id):
        _sync(path, quantum_id, reset=True)


def _sync(path: Path, quantum_id: int, *, reset: bool) -> bool:
    """One look: False when the worktree is ahead of the tip and `reset` is off."""
    branch = branch_for(quantum_id)
    tip = fetch([branch]).get(branch, "")
    if not tip:
        return True
    with file_lock(f"commit-{stripe(str(path.resolve()))}"):
        head = git("rev-parse", "HEAD", cwd=path)
        if head == tip:
            return True
        behind = git_run("merge-base", "--is-ancestor", head, tip, cwd=path).returncode == 0
        if not behind and not reset:
            return False
        how = (
            ("merge", "--ff-only", "--quiet", tip)
            if behind
            else ("reset", "--keep", "--quiet", tip)
        )
        proc = git_run(*how, cwd=path)
        refused = proc.stderr.strip()[-300:] if proc.returncode != 0 else ""
        if refused:
            _set_aside(path, tip, quantum_id=quantum_id)
        # What git wrote is root's on a root worker: the quantum's sandboxed agents must be
        # able to write in folders that arrived from another host.
        workspace_own(path, quantum_id=quantum_id)
    if refused:
        logger.warning(
            "worktree %s: local changes in the way of the central tip %s set aside in git's "
            "stash (`git stash list` in the worktree): %s",
            path, tip[:10], refused, extra={"quantum_id": quantum_id},
        )  # fmt: skip
    elif not behind:
        logger.info(
            "worktree %s reset to the central tip %s (local commits were fenced out)",
            path, tip[:10], extra={"quantum_id": quantum_id},
        )  # fmt: skip
    return True


def _set_aside(path: Path, tip: str, *, quantum_id: int) -> None:
    """Changes that keep the worktree from its central tip (most often what an execution that
    was cut off or killed left uncommitted; its agent ran again elsewhere) go to git's stash,
    kept for an operator rather than deleted, and the worktree goes to the tip: the next agent
    works on what the central branch holds. The stash is one list for all worktrees of the
    clone: entries are only ever added, under a lock of this host."""
    with file_lock(f"stash-{repo_key()}"):
        git(
            *("stash", "push", "--include-untracked", "--quiet"),
            *("-m", f"annihilation q-{quantum_id}: set aside to reach {tip[:10]}"),
            *("--", ".", *submodules_left_out(path)),
            cwd=path,
        )
    git("reset", "--hard", "--quiet", tip, cwd=path)


# --- after a commit -------------------------------------------------------------------------
def _replay(repo: Path, commit: str, onto: str, *, message: str, author: str) -> str:
    """`commit` (one commit) applied on `onto` without touching any worktree: a three-way merge
    of trees whose base is the commit's parent (git merge-tree of two synthetic commits over a
    common root that holds the parent's tree), then a commit of the result on `onto`.
    CentralConflict naming `onto` when both changed the same lines."""

    def commit_tree(tree: str, *parents: str) -> str:
        args = ["commit-tree", tree, *(a for p in parents for a in ("-p", p)), "-m", message]
        proc = git_run(*args, cwd=repo, author=author)
        if proc.returncode != 0:
            raise WorkspaceError(f"git commit-tree failed in {repo}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    root = commit_tree(f"{commit}^^{{tree}}")
    ours = commit_tree(f"{onto}^{{tree}}", root)
    theirs = commit_tree(f"{commit}^{{tree}}", root)
    merged = git_run(
        "merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs, cwd=repo
    )
    lines = merged.stdout.split("\n")
    if merged.returncode != 0:
        if merged.returncode == 1:
            files = ", ".join(f for f in lines[1:] if f)[:500]
            subject = git("log", "-1", "--format=%h %s", onto, cwd=repo)
            raise CentralConflict(
                f"the commit conflicts with {subject} (pushed meanwhile by a sibling agent) "
                f"in {files or 'the tree'}; nothing was pushed"
            )
        raise WorkspaceError(f"git merge-tree failed in {repo}: {merged.stderr.strip()}")
    return commit_tree(lines[0].strip(), onto)


def _push(
    repo: Path, *, branch: str, sha: str, expected: str, fence: Fence | None, new_fence: str
) -> tuple[bool, str]:
    """One atomic push of the branch (and the fence moved on): (landed, why not: "fence",
    "branch" or git's message). Network failures are retried by `_network`."""
    args = [
        "push",
        "--porcelain",
        "--atomic",
        f"--force-with-lease=refs/heads/{branch}:{expected}",
    ]
    refspecs = [f"{sha}:refs/heads/{branch}"]
    if fence is not None:
        args.append(f"--force-with-lease={fence.ref}:{fence.sha}")
        refspecs.append(f"{new_fence}:{fence.ref}")
    proc = network_run(*args, REMOTE, *refspecs, cwd=repo)
    if proc.returncode == 0:
        return True, ""
    # Porcelain: "!<TAB>src:dst<TAB>[rejected] (stale info)" for the lease that failed; the other
    # ref of the atomic push says "(atomic push failed)".
    refused = [
        line.split("\t")[1]
        for line in proc.stdout.splitlines()
        if line.startswith("!") and "(atomic push failed)" not in line
    ]
    if fence is not None and any(ref.endswith(":" + fence.ref) for ref in refused):
        return False, "fence"  # whatever else was refused too: this execution is stale
    if refused:
        return False, "branch"
    raise WorkspaceError(f"git push failed in {repo}: {proc.stderr.strip()[-600:]}")


def _landed(repo: Path, *, branch: str, sha: str, fence: Fence | None, new_fence: str) -> bool:
    """Whether a push whose answer was lost (the network) landed after all: the central
    branch is at `sha` and the fence at `new_fence` (the push was atomic: both or neither)."""
    refs = [f"refs/heads/{branch}", *([fence.ref] if fence is not None else [])]
    listing = network("ls-remote", REMOTE, *refs, cwd=repo)
    found = {ref: oid for oid, ref in (line.split("\t", 1) for line in listing.splitlines())}
    return found.get(f"refs/heads/{branch}") == sha and (
        fence is None or found.get(fence.ref) == new_fence
    )


def commit_land(
    *,
    workspace: Path,
    quantum_id: int,
    fence: Fence | None,
    commit: str,
    author: str,
    message: str,
) -> str:
    """Push a commit just made in the worktree to the quantum's central branch; the sha as it
    landed (replayed on the central tip when another agent pushed meanwhile). The caller holds
    the quantum's commit lock. StaleExecution: the fence moved, nothing landed, and the local
    branch is back at the central tip. CentralConflict: the commit does not apply on it."""
    repo = repo_local()
    branch = branch_for(quantum_id)
    parent = git("rev-parse", f"{commit}^", cwd=workspace)
    for attempt in range(PUSH_RETRIES):
        # First as last fetched (the stage's start, or this host's last push): the lease is
        # checked by the server, so a tip that moved meanwhile only costs a refusal and a fetch.
        central = _tracked(repo, branch) if attempt == 0 else fetch([branch]).get(branch, "")
        sha = (
            commit
            if central in ("", parent)
            else _replay(repo, commit, central, message=message, author=author)
        )
        new_fence = _fence_blob(repo, fence) if fence is not None else ""
        try:
            landed, why = _push(
                repo, branch=branch, sha=sha, expected=central, fence=fence, new_fence=new_fence
            )
        except WorkspaceError:
            if not _landed(repo, branch=branch, sha=sha, fence=fence, new_fence=new_fence):
                raise
            landed, why = True, ""
        if landed:
            if fence is not None:
                fence.sha = new_fence
            if sha != commit:
                _worktree_move(workspace, sha, quantum_id=quantum_id)
            return sha
        if why == "fence":
            tips = fetch([branch, base_branch()])
            back = tips.get(branch) or tips.get(base_branch(), "")
            if back:
                _worktree_move(workspace, back, quantum_id=quantum_id)
            raise StaleExecution(
                f"{fence.agent_id if fence else 'agent'}: another execution holds the agent "
                f"now (its fence moved in the central repository); commit {commit[:10]} dropped"
            )
        logger.info(
            "central %s moved under a push; replaying", branch, extra={"quantum_id": quantum_id}
        )
    raise WorkspaceError(f"central branch {branch} kept moving: nothing pushed")


# --- an agent that waits -------------------------------------------------------------------
def wip_save(*, workspace: Path, fence: Fence) -> str:
    """Before an execution lets its agent wait (the Tether, a budget): the worktree's uncommitted
    work (changed and new files, the commit's excludes left out) as a commit on HEAD, pushed to
    the agent's wip ref in one atomic push that moves the fence on to a blob naming it. Returns
    the commit. StaleExecution: the fence moved (nothing pushed)."""
    repo = repo_local()
    head = git("rev-parse", "HEAD", cwd=workspace)
    with tempfile.TemporaryDirectory(prefix="annihilation-wip-") as aside:
        # A private index: the worktree's own (and its agent's files) stay as they are.
        index = Path(aside) / "index"

        def step(*args: str) -> str:
            proc = git_run(*args, cwd=workspace, index_file=index)
            if proc.returncode != 0:
                raise WorkspaceError(f"git {args[0]} failed in {workspace}: {proc.stderr.strip()}")
            return proc.stdout.strip()

        step("read-tree", head)
        step(*add_all_args(workspace, index_file=index))
        tree = step("write-tree")
    proc = git_run(
        "commit-tree", tree, "-p", head, "-m", f"work of {fence.agent_id} set aside while it waits",
        cwd=workspace,
    )  # fmt: skip
    if proc.returncode != 0:
        raise WorkspaceError(f"git commit-tree failed in {workspace}: {proc.stderr.strip()}")
    wip = proc.stdout.strip()
    new_fence = _fence_blob(repo, fence, wip=wip)
    proc = network_run(
        *("push", "--porcelain", "--atomic", f"--force-with-lease={fence.ref}:{fence.sha}"),
        *(REMOTE, f"+{wip}:{wip_ref(fence.agent_id)}", f"{new_fence}:{fence.ref}"),
        cwd=repo,
    )
    if proc.returncode != 0:
        if any(line.startswith("!") and fence.ref in line for line in proc.stdout.splitlines()):
            raise StaleExecution(
                f"{fence.agent_id}: another execution holds the agent now (its fence moved in "
                "the central repository); its work was not set aside"
            )
        raise WorkspaceError(f"git push failed in {repo}: {proc.stderr.strip()[-600:]}")
    fence.sha = new_fence
    return wip


def wip_restore(*, workspace: Path, quantum_id: int, fence: Fence) -> bool:
    """The work the previous execution set aside when its agent began to wait (the fence it
    left names it), applied to this worktree as uncommitted changes on the branch as it is now
    (a three-way pick: a sibling may have pushed meanwhile). False when it set none aside.
    CentralConflict when it does not apply; the worktree is left as it was."""
    if not fence.previous_wip:
        return False
    repo = repo_local()
    seen = f"refs/annihilation/seen-wip/{wip_ref(fence.agent_id).removeprefix(WIP_PREFIX)}"
    network(
        *("fetch", "--quiet", "--no-tags", "--no-write-fetch-head"),
        *(REMOTE, f"+{wip_ref(fence.agent_id)}:{seen}"),
        cwd=repo,
    )
    wip = git("rev-parse", seen, cwd=repo)
    if wip != fence.previous_wip:
        raise CentralConflict(
            f"{fence.agent_id}: the set-aside work is {wip[:10]}, its fence names "
            f"{fence.previous_wip[:10]}"
        )
    if git("rev-parse", f"{wip}^{{tree}}", cwd=repo) == git(
        "rev-parse", f"{wip}^^{{tree}}", cwd=repo
    ):
        return True  # nothing was uncommitted
    with file_lock(f"commit-{stripe(str(workspace.resolve()))}"):
        proc = git_run("cherry-pick", "--no-commit", wip, cwd=workspace)
        if proc.returncode != 0:
            git_run("cherry-pick", "--abort", cwd=workspace)
            raise CentralConflict(
                f"{fence.agent_id}: its work set aside on {fence.previous_host} ({wip[:10]}) "
                f"does not apply here: {proc.stderr.strip()[-300:]}"
            )
        git("reset", "--quiet", cwd=workspace)  # unstaged, as the agent left it
    workspace_own(workspace, quantum_id=quantum_id)
    return True


def agent_landed(quantum_id: int, subject: str) -> bool:
    """Whether a commit with this subject (an agent's, workspaces.commit_message) is on the
    quantum's central branch as last fetched."""
    proc = git_run(
        *("log", "-1", "--format=%H", "--fixed-strings", f"--grep={subject}"),
        tracking(branch_for(quantum_id)),
        cwd=repo_local(),
    )
    return proc.returncode == 0 and bool(proc.stdout.strip())


def _tracked(repo: Path, branch: str) -> str:
    """The central branch's tip as this host last fetched or pushed it ("" when none)."""
    proc = git_run("rev-parse", "--verify", "--quiet", tracking(branch), cwd=repo)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _worktree_move(workspace: Path, sha: str, *, quantum_id: int) -> None:
    """The worktree's branch to `sha`, keeping files other agents of this host are editing
    (`reset --keep`; when it refuses, the worktree stays and the next commit is replayed)."""
    with file_lock(f"commit-{stripe(str(workspace.resolve()))}"):
        proc = git_run("reset", "--keep", "--quiet", sha, cwd=workspace)
        if proc.returncode == 0:
            workspace_own(workspace, quantum_id=quantum_id)  # as in `_sync`
    if proc.returncode != 0:
        logger.warning(
            "worktree %s not moved to %s: %s", workspace, sha[:10], proc.stderr.strip()[-300:],
            extra={"quantum_id": quantum_id},
        )  # fmt: skip


def quantum_lock(quantum_id: int) -> RedisLock:
    """The quantum's pushes, one at a time across hosts (fan-out siblings may run anywhere).
    Its TTL is the agent lease's: a host lost while holding it delays the quantum's re-run no
    longer than its lost leases do (the holder renews it every third of the TTL)."""
    return RedisLock(
        f"central:commit:{repo_key()}:{quantum_id}",
        ttl_s=float(getattr(settings, "BURSTS_HEARTBEAT_TTL_S", 30.0)),
        wait_s=float(getattr(settings, "ANNIHILATION_CENTRAL_LOCK_WAIT_S", 120.0)),
    )


def branch_push(branch: str, sha: str, *, expected: str) -> bool:
    """Move a central branch from `expected` to `sha` (compare-and-set, `--force-with-lease`):
    False when it is no longer at `expected`. The tracking ref follows (git's push does it)."""
    repo = repo_local()
    proc = network_run(
        *("push", "--porcelain", f"--force-with-lease=refs/heads/{branch}:{expected}"),
        *(REMOTE, f"{sha}:refs/heads/{branch}"),
        cwd=repo,
    )
    if proc.returncode == 0:
        return True
    if any(line.startswith("!") for line in proc.stdout.splitlines()):
        return False
    raise WorkspaceError(f"git push of {branch} failed in {repo}: {proc.stderr.strip()[-600:]}")


def shared_lock_try(name: str, *, ttl_s: float = 60.0) -> AbstractContextManager[bool]:
    """One holder of `name` among all the hosts that work on the repository, without waiting
    (True when held): a Redis lock (renewed while held) for a central repository, this host's
    file lock `name` for a local one."""
    if repo_url():
        return redis_lock_try(f"repo:{repo_key()}:{name}", ttl_s=ttl_s)
    return file_lock_try(name)
