"""The merge queue: approved changes merged into the target branch one at a time, each verified
on the merged result before the target moves.

One consumer at a time: `merge_queue_run` takes a lock file without waiting (fcntl: the lock
goes with the process, so a worker that dies frees it; with a central repository a Redis lock
instead, one consumer among all hosts, which a dead worker frees when its TTL runs out) and, holding it, takes entries in
approval order until the queue is empty. Any number of workers may be kicked at once; all but
one return at once. After letting the lock go the consumer looks once more, so an entry
approved while it was finishing is never left waiting for the next kick (beat's `tether.sweep`
kicks the queue too).

Each entry, in a scratch worktree detached at the target's sha (one, reused: only one consumer
runs):
1. `merge --no-ff` of the reviewed head (a conflict: the change goes back, nothing moves);
2. the quantum's verify commands plus its repository's (the default repository's include
   settings.TETHER_VERIFY_COMMANDS), through the guard and
   the sandbox (psychonauts.containment.verify): a failure sends the change back, nothing moves;
3. the target moves by compare-and-set: `update-ref <target> <merge> <old>`, or, when the target
   is checked out somewhere (the main checkout), `merge --ff-only` there, which refuses local
   changes in the way and leaves index and files in step with the branch. The target moved by
   someone else meanwhile: merged and verified again on the new target.

A consumer that dies while merging leaves the entry `merging` (and perhaps its merge sha):
the next consumer takes it first, finds the target already at that merge and records it, or
starts the entry over. Nothing of a scratch worktree survives into the next entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from core.hooks import Hook
from psychonauts.containment.sandbox import workspace_own
from psychonauts.containment.verify import VerifyReport, verify_commands_run
from psychonauts.errors import WorkspaceError
from psychonauts.workspaces.central import branch_push, shared_lock_try
from psychonauts.workspaces.git import TETHER, git, git_run
from psychonauts.workspaces.repository import repo_key, repo_local, repo_url
from psychonauts.workspaces.worktrees import scratch_worktree
from quanta.models import Quantum
from repos.context import current, working_on_id
from tether.errors import TetherError
from tether.models import ChangeReview
from tether.services.changes import (
    change_merge_blocked,
    change_merge_claim,
    change_merge_conflicted,
    change_merge_done,
    change_merge_failed,
    change_merge_intent,
    change_merge_moved,
    changes_queued,
    merge_lock,
    queued_repository_ids,
    sha_of,
    worktree_of,
)

logger = logging.getLogger(__name__)

# How many times one entry is merged again when the target moved under it (someone else moved
# the branch between our merge and our compare-and-set) before it waits for the next kick.
RACE_RETRIES = 3


class QueueBlocked(TetherError):
    """The target branch cannot move for a reason of its own (its checkout has local changes in
    the way): the entry stays at the head of the queue and the consumer stops until next kick."""


class ForgeDeclined(TetherError):
    """The change's forge would not merge it (not approved there, head moved, handed to the
    forge's own merge queue): the change goes back to pending, nothing moved here."""


# f(review) -> the forge's merge sha once the change merged through its pull request, None for
# a repository that merges locally; ForgeDeclined, or TetherError (the queue is blocked and
# tried again on the next kick). Filled by the forges app.
FORGE_MERGERS: Hook[Callable[[ChangeReview], str | None]] = Hook("tether.forge_mergers")


@dataclass
class QueueReport:
    """What one consumer run did, change ids by outcome."""

    merged: list[int] = field(default_factory=list)
    conflicted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)
    blocked: list[int] = field(default_factory=list)
    busy: bool = False  # another consumer held the queue


def _repo() -> Path:
    return repo_local()


def scratch_path() -> Path:
    return Path(settings.ANNIHILATION_HOME) / "merges" / f"queue-{repo_key()}"


def _scratch_at(sha: str) -> Path:
    """The scratch worktree, detached at `sha` and clean (whatever a dead consumer or the last
    entry's checks left in it is gone, a half-done merge included)."""
    where = scratch_path()
    if (where / ".git").exists():
        git_run("merge", "--abort", cwd=where)
    return scratch_worktree(where, sha)


def _scratch_merge(where: Path, review: ChangeReview) -> tuple[str, list[str]]:
    """(merge sha, []) or ("", the conflicting files; the merge aborted)."""
    message = f"Merge {review.branch} (change #{review.pk}, quantum #{review.quantum_id})"
    proc = git_run(
        *("merge", "--no-ff", "--no-edit", "-m", message, review.head_sha),
        cwd=where,
        identity=TETHER,
    )
    if proc.returncode == 0:
        return git("rev-parse", "HEAD", cwd=where), []
    conflicted = git("diff", "--name-only", "--diff-filter=U", cwd=where).splitlines()
    git_run("merge", "--abort", cwd=where)
    if not conflicted:
        raise TetherError(f"git merge failed: {(proc.stderr or proc.stdout).strip()}")
    return "", conflicted


def _verify(where: Path, review: ChangeReview) -> VerifyReport:
    own = list(
        Quantum.objects.filter(pk=review.quantum_id).values_list("verify_commands", flat=True)
    )
    commands = [*(own[0] if own else []), *current().verify_commands]
    if not commands:
        return VerifyReport(checks=())
    # The checks run as the quantum's sandbox user, as its agents' do: the tree is theirs.
    workspace_own(where, quantum_id=review.quantum_id)
    return verify_commands_run(
        commands,
        workspace=where,
        quantum_id=review.quantum_id,
        timeout_s=settings.VERIFY_TIMEOUT_S,
    )


def _target_move(target: str, old: str, merge_sha: str) -> bool:
    """Move the target from `old` to the merge (compare-and-set). False when it is no longer at
    `old`; QueueBlocked when its checkout refuses (local changes in the way). A central
    repository: pushed there, `--force-with-lease` naming `old`."""
    if repo_url():
        return branch_push(target, merge_sha, expected=old)
    checkout = worktree_of(target)
    if checkout is None:
        proc = git_run("update-ref", f"refs/heads/{target}", merge_sha, old, cwd=_repo())
        return proc.returncode == 0
    # Checked out (the main checkout): moving the ref alone would leave its index and files at
    # the old commit, as if the merge had been undone there. A fast-forward merge in the
    # checkout moves all three, and refuses when local changes would be overwritten.
    if sha_of(target) != old:
        return False
    proc = git_run("merge", "--ff-only", "--quiet", merge_sha, cwd=checkout, identity=TETHER)
    if proc.returncode == 0:
        return True
    if sha_of(target) != old:
        return False
    raise QueueBlocked(
        f"{target} is checked out in {checkout} and could not be moved to the merge: "
        f"{(proc.stderr or proc.stdout).strip()}"
    )


def _process(review: ChangeReview, report: QueueReport) -> None:
    """One entry, merging, to its outcome (or QueueBlocked)."""
    change_id = review.pk
    now_sha = sha_of(review.branch)
    if now_sha != review.head_sha:
        state = f"now at {now_sha[:10]}" if now_sha else "deleted"
        change_merge_moved(
            change_id=change_id,
            reason=(
                f"branch {review.branch} moved since the review (reviewed "
                f"{review.head_sha[:10]}, {state}); nothing merged. Review the new commits."
            ),
        )
        report.returned.append(change_id)
        return
    for _ in range(RACE_RETRIES):
        old = sha_of(review.base)
        if not old:
            change_merge_moved(change_id=change_id, reason=f"base branch {review.base} is gone")
            report.returned.append(change_id)
            return
        if (
            review.merge_sha
            and git_run(
                "merge-base", "--is-ancestor", review.merge_sha, old, cwd=_repo()
            ).returncode
            == 0
        ):
            # A consumer died after moving the target, before recording it.
            change_merge_done(change_id=change_id, merge_sha=review.merge_sha)
            report.merged.append(change_id)
            return
        where = _scratch_at(old)
        merge_sha, conflicted = _scratch_merge(where, review)
        if conflicted:
            change_merge_conflicted(change_id=change_id, conflicted=conflicted)
            report.conflicted.append(change_id)
            return
        verified = _verify(where, review)
        if not verified.passed:
            change_merge_failed(change_id=change_id, report=verified)
            report.failed.append(change_id)
            return
        if _forge_merged(review, verified, report):
            return
        change_merge_intent(change_id=change_id, merge_sha=merge_sha)
        with merge_lock():
            moved = _target_move(review.base, old, merge_sha)
        if moved:
            checks = [dict(c) for c in verified.as_data()]
            change_merge_done(change_id=change_id, merge_sha=merge_sha, checks=checks)
            report.merged.append(change_id)
            return
        logger.info("merge queue: %s moved under change %s; merging again", review.base, change_id)
        review.merge_sha = ""
    raise QueueBlocked(f"{review.base} kept moving under change #{change_id}")


def _forge_merged(review: ChangeReview, verified: VerifyReport, report: QueueReport) -> bool:
    """Verified: a forge repository's change merges through its pull request instead of moving
    the target here (the forge moves its base). False for a repository that merges locally."""
    for merger in FORGE_MERGERS:
        try:
            sha = merger(review)
        except ForgeDeclined as exc:
            change_merge_moved(change_id=review.pk, reason=str(exc))
            report.returned.append(review.pk)
            return True
        if sha is not None:
            checks = [dict(c) for c in verified.as_data()]
            change_merge_done(change_id=review.pk, merge_sha=sha, checks=checks)
            report.merged.append(review.pk)
            return True
    return False


def merge_queue_run(*, limit: int | None = None, repository_id: int | None = None) -> QueueReport:
    """Take the queue's entries in order until it is empty (or `limit` entries): a no-op
    (busy) when another consumer runs. Each repository has a queue, a lock and a scratch
    worktree of its own: `repository_id` runs that one's, None each one holding entries in
    turn (one busy elsewhere is skipped, not waited for)."""
    if repository_id is not None:
        with working_on_id(repository_id):
            return _queue_run(QueueReport(), limit, repository_id)
    report = QueueReport()
    for rid in queued_repository_ids():
        with working_on_id(rid):
            one = _queue_run(QueueReport(), limit, rid)
        for name in ("merged", "conflicted", "failed", "returned", "blocked"):
            getattr(report, name).extend(getattr(one, name))
        report.busy = report.busy or one.busy
    return report


def _queue_run(report: QueueReport, limit: int | None, repository_id: int) -> QueueReport:
    done = 0
    while True:
        # One consumer among all hosts (a central repository: a Redis lock; see docs/hosts.md).
        with shared_lock_try(f"merge-queue-{repo_key()}", ttl_s=60.0) as held:
            if not held:
                report.busy = True
                return report
            while limit is None or done < limit:
                review = change_merge_claim(repository_id=repository_id)
                if review is None:
                    break
                done += 1
                started = time.monotonic()
                try:
                    _process(review, report)
                except (QueueBlocked, WorkspaceError, TetherError) as exc:
                    # Head-of-line: the next entry would meet the same target.
                    logger.warning("merge queue: change %s blocked: %s", review.pk, exc)
                    change_merge_blocked(change_id=review.pk, reason=f"blocked: {exc}")
                    report.blocked.append(review.pk)
                    return report
                logger.info(
                    "merge queue: change %s done in %.2fs",
                    review.pk,
                    time.monotonic() - started,
                    extra={"change_id": review.pk},
                )
        # Looked again outside the lock: an entry approved while we were letting it go.
        if (limit is not None and done >= limit) or not changes_queued(repository_id=repository_id):
            return report
