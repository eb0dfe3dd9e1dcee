"""Grounding of code changes: a review per quantum run that left commits, then approve (into the
merge queue, tether/services/merge_queue.py, which merges, verifies and moves the base branch)
or reject (reopen the quantum). This module is the one writer of ChangeReview: the queue's
transitions are here, each a compare-and-set on the status."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from bursts.models import QuantumRun
from core.events import publish
from core.hooks import Hook
from core.redaction import redact
from psychonauts.containment.verify import VerifyReport
from psychonauts.workspaces.central import base_branch, fetch_or_last, tracking
from psychonauts.workspaces.git import git, git_run
from psychonauts.workspaces.repository import (
    branch_for,
    registry_lock,
    repo_local,
    repo_lock,
    repo_url,
)
from psychonauts.workspaces.worktrees import workspace_left_out, worktree_path
from quanta.errors import IllegalTransition
from quanta.models import Dependency, DependencyKind, Quantum
from quanta.services import quantum_reopen
from repos.context import current, working_on_id, working_on_quantum
from tether.errors import AlreadyDecided, BranchMoved, InvalidInput, NotFound, TetherError
from tether.events import CHANGES_TOPIC, ChangePayload, TetherEventType
from tether.models import CHANGE_IN_QUEUE, ChangeReview, ChangeStatus, ReviewDue, Risk
from tether.risk import FileChange, RiskVerdict, risk_assess
from tether.services.corrections import correction_file
from tether.services.drifts import drift_built_on_set

logger = logging.getLogger(__name__)

AUTO = "auto (low risk)"
REVIEW_TASK = "tether.change_review_create"
# Policies that auto-merge more low-risk changes than settings.TETHER_AUTO_MERGE_LOW_RISK does:
# each gets the changed quantum's labels (the autopilot registers one for its own quanta).
AutoMergePolicy = Callable[[Sequence[str]], bool]
AUTO_MERGE_POLICIES: Hook[AutoMergePolicy] = Hook("tether.auto_merge_policies")
# f(review): called with each new review in its transaction (the forges app publishes it as a
# pull request). One returning True leaves the decision to the forge's reviewers: no auto-merge.
ON_REVIEW_CREATED: Hook[Callable[[ChangeReview], bool]] = Hook("tether.on_review_created")


def _auto_merge(review: ChangeReview) -> bool:
    """Whether a new review is approved at once: low risk, and the setting or a policy says so."""
    if review.risk != Risk.LOW:
        return False
    if settings.TETHER_AUTO_MERGE_LOW_RISK:
        return True
    if not AUTO_MERGE_POLICIES:
        return False
    labels = Quantum.objects.values_list("labels", flat=True).get(pk=review.quantum_id)
    return any(policy(labels) for policy in AUTO_MERGE_POLICIES)


QUEUE_TASK = "tether.merge_queue_run"
# How many left-out files a review keeps (the rest are counted in the last entry).
LEFT_OUT_LIMIT = 200


def _repo() -> Path:
    """The repository git runs in: the target itself, or this host's clone of the central one
    (whose branches are read as fetched: `sha_of`, `tracking`)."""
    return repo_local()


def merge_lock() -> AbstractContextManager[None]:
    """Moves of the target branch, one at a time (git's index lock would refuse)."""
    return repo_lock("merge")


def sha_of(ref: str) -> str:
    """The commit a branch names, or "" when it names none. A central repository's branch is
    fetched first (its last fetch read when the central repository is unreachable)."""
    if repo_url():
        fetch_or_last([ref])
    proc = git_run("rev-parse", "--verify", "--quiet", f"{tracking(ref)}^{{commit}}", cwd=_repo())
    return proc.stdout.strip() if proc.returncode == 0 else ""


def target_branch() -> str:
    """The current repository's target branch (the default one's: TETHER_TARGET_BRANCH), or
    the branch it has checked out (a central repository: its HEAD branch)."""
    if repo_url():
        return base_branch()
    return current().target_branch or git("symbolic-ref", "--short", "HEAD", cwd=_repo())


def _files(base: str, head: str) -> list[FileChange]:
    base = tracking(base)
    counts: dict[str, tuple[int, int]] = {}
    for line in git(
        "diff", "--no-renames", "--numstat", f"{base}...{head}", cwd=_repo()
    ).splitlines():
        plus, minus, path = line.split("\t", 2)
        # Binary files show `-` (renames are off: a rename is a deletion and an addition).
        counts[path] = (int(plus) if plus.isdigit() else 0, int(minus) if minus.isdigit() else 0)
    files: list[FileChange] = []
    for line in git(
        "diff", "--no-renames", "--name-status", f"{base}...{head}", cwd=_repo()
    ).splitlines():
        status, path = line.split("\t", 1)
        added, deleted = counts.get(path, (0, 0))
        files.append({"path": path, "status": status, "additions": added, "deletions": deleted})
    return files


def change_payload(review: ChangeReview) -> ChangePayload:
    """What events carry: never the diff (it could hold what the redaction missed)."""
    return {
        "change_id": review.pk,
        "quantum_id": review.quantum_id,
        "branch": review.branch,
        "base": review.base,
        "risk": review.risk,
        "reasons": review.reasons,
        "additions": review.additions,
        "deletions": review.deletions,
        "files": len(review.files),
        "status": review.status,
    }


def _record_built_on(review: ChangeReview) -> None:
    """Open drifts of this quantum: which files and later quanta now build on them."""
    later = list(
        Dependency.objects.filter(
            depends_on_id=review.quantum_id, kind=DependencyKind.BLOCKS
        ).values_list("quantum_id", flat=True)
    )
    drift_built_on_set(
        quantum_id=review.quantum_id, files=[f["path"] for f in review.files], quanta=sorted(later)
    )


def reviews_due(*, runs: Sequence[tuple[int, int]]) -> None:
    """Done runs, as (run, quantum), whose branches are to be reviewed: each one's review due
    now, in the caller's transaction, and its review task sent once that commits."""
    if not runs:
        return
    now = timezone.now()
    ReviewDue.objects.bulk_create(
        [
            ReviewDue(quantum_run_id=run, quantum_id=quantum, due_at=now, sent_at=now)
            for run, quantum in runs
        ],
        ignore_conflicts=True,
    )
    _reviews_send([run for run, _ in runs])


_RESEND = f"""
UPDATE {ReviewDue._meta.db_table} SET sent_at = %(now)s
 WHERE quantum_run_id IN (
       SELECT quantum_run_id FROM {ReviewDue._meta.db_table} WHERE sent_at < %(before)s
        ORDER BY sent_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING quantum_run_id
"""


@transaction.atomic
def reviews_resend_due(*, limit: int = 500) -> list[int]:
    """Reviews due for longer than settings.TETHER_REVIEW_RESEND_S (their task's message lost
    with a worker or the broker): each task sent again, and its clock restarted (compare-and-set,
    so two sweeps never send one twice). Returns their runs."""
    now = timezone.now()
    before = now - timedelta(seconds=settings.TETHER_REVIEW_RESEND_S)
    with connection.cursor() as cursor:
        cursor.execute(_RESEND, {"now": now, "before": before, "limit": limit})
        runs = sorted(row[0] for row in cursor.fetchall())
    _reviews_send(runs)
    return runs


def _reviews_send(runs: list[int]) -> None:
    def send() -> None:
        from core.celery import app  # the Celery application only where a task is sent

        for run in runs:
            app.send_task(REVIEW_TASK, args=(run,))

    if runs:
        transaction.on_commit(send)


@transaction.atomic
def change_review_create(*, quantum_run_id: int) -> ChangeReview | None:
    """Review what a finished run left on its quantum's branch (None when there is nothing);
    the run's review is no longer due either way.

    Idempotent per run. An older pending review of the same quantum is superseded: the new diff
    against the base contains it.
    """
    repository_id = (
        QuantumRun.objects.filter(pk=quantum_run_id)
        .values_list("quantum__repository_id", flat=True)
        .first()
    )
    with working_on_id(repository_id):  # the run's branch is in its quantum's repository
        review = _review_make(quantum_run_id)
    ReviewDue.objects.filter(quantum_run_id=quantum_run_id).delete()
    return review


def _review_make(quantum_run_id: int) -> ChangeReview | None:
    existing = ChangeReview.objects.filter(quantum_run_id=quantum_run_id).first()
    if existing is not None:
        return existing
    if not (_repo() / ".git").exists():
        return None  # no target repository (an executor that writes no code)
    run = QuantumRun.objects.only("quantum_id", "branch").get(pk=quantum_run_id)
    branch = run.branch or branch_for(run.quantum_id)
    head = sha_of(branch)
    if not head:
        return None  # shared-tree mode, or the agents changed nothing
    base = target_branch()
    if (
        not sha_of(base)
        or git("rev-list", "--count", f"{tracking(base)}..{head}", cwd=_repo()) == "0"
    ):
        return None
    diff = git("diff", f"{tracking(base)}...{head}", cwd=_repo())
    files = _files(base, head)
    left_out = workspace_left_out(worktree_path(run.quantum_id), limit=LEFT_OUT_LIMIT)
    verdict = risk_assess(files=files, diff=diff)
    limit = settings.TETHER_DIFF_LIMIT
    stored = redact(diff)
    if len(stored) > limit:
        stored = stored[:limit] + f"\n… [{len(stored) - limit} characters cut]\n"
    superseded = list(
        ChangeReview.objects.filter(
            quantum_id=run.quantum_id, status=ChangeStatus.PENDING
        ).values_list("pk", flat=True)
    )
    ChangeReview.objects.filter(pk__in=superseded, status=ChangeStatus.PENDING).update(
        status=ChangeStatus.SUPERSEDED, decided_by="tether", decided_at=timezone.now()
    )
    try:
        with transaction.atomic():  # a savepoint: the task and the demo may race on one run
            review = _create(
                quantum_run_id, run.quantum_id, branch, base, head, stored, files, verdict
            )
            if left_out:
                ChangeReview.objects.filter(pk=review.pk).update(left_out=left_out)
                review.left_out = left_out
    except IntegrityError:
        return ChangeReview.objects.get(quantum_run_id=quantum_run_id)
    _record_built_on(review)
    publish(CHANGES_TOPIC, TetherEventType.CHANGE_REVIEW_CREATED, change_payload(review))
    on_forge = [hook(review) for hook in ON_REVIEW_CREATED]
    if not any(on_forge) and _auto_merge(review):
        try:
            return change_approve(change_id=review.pk, by=AUTO)
        except TetherError as exc:
            logger.info("tether: auto-merge of change %s did not happen: %s", review.pk, exc)
    return review


def _create(
    quantum_run_id: int,
    quantum_id: int,
    branch: str,
    base: str,
    head: str,
    stored: str,
    files: list[FileChange],
    verdict: RiskVerdict,
) -> ChangeReview:
    return ChangeReview.objects.create(
        quantum_run_id=quantum_run_id,
        quantum_id=quantum_id,
        branch=branch,
        base=base,
        head_sha=head,
        diff=stored,
        files=[dict(f) for f in files],
        additions=sum(f["additions"] for f in files),
        deletions=sum(f["deletions"] for f in files),
        risk=verdict.risk,
        reasons=verdict.reasons,
    )


def worktree_of(branch: str) -> Path | None:
    """Where the branch is checked out (git refuses a second checkout of it), if anywhere."""
    current: Path | None = None
    # Exclusive: listing worktrees fails on the half-written record of one being added.
    with registry_lock(shared=False):
        listing = git("worktree", "list", "--porcelain", cwd=_repo())
    for line in listing.splitlines():
        if line.startswith("worktree "):
            current = Path(line.removeprefix("worktree "))
        elif line == f"branch refs/heads/{branch}":
            return current
    return None


def _queue_kick() -> None:
    """Wake the merge queue's consumer after commit (it takes the queue's lock; a second kick
    while it runs is a no-op, and it looks again after letting the lock go)."""
    from core.celery import app  # the Celery application only where a task is sent

    transaction.on_commit(lambda: app.send_task(QUEUE_TASK))


def _branch_check(review: ChangeReview) -> None:
    with working_on_quantum(review.quantum_id):  # the branches are its quantum's repository's
        _branches_check(review)


def _branches_check(review: ChangeReview) -> None:
    now_sha = sha_of(review.branch)
    if now_sha != review.head_sha:
        state = f"now at {now_sha[:10]}" if now_sha else "deleted"
        raise BranchMoved(
            f"change #{review.pk}: branch {review.branch} moved since the review (reviewed "
            f"{review.head_sha[:10]}, {state}); nothing merged. Review the new commits first."
        )
    if not sha_of(review.base):
        raise BranchMoved(f"change #{review.pk}: base branch {review.base} is gone")


@transaction.atomic
def change_approve(*, change_id: int, by: str = "operator") -> ChangeReview:
    """Approve a pending change into the merge queue (queued; the queue merges it, verifies the
    merged result and moves the base). The branch must still point at the sha that was
    reviewed (moved or vanished: BranchMoved, nothing changed). Approving twice: AlreadyDecided."""
    review = ChangeReview.objects.filter(pk=change_id).first()
    if review is None:
        raise NotFound(f"no change review #{change_id}")
    if review.status != ChangeStatus.PENDING:
        raise AlreadyDecided(f"change #{change_id} is {review.status}; nothing changed")
    _branch_check(review)
    now = timezone.now()
    updated = ChangeReview.objects.filter(pk=change_id, status=ChangeStatus.PENDING).update(
        status=ChangeStatus.QUEUED, decided_by=by, queued_at=now, comment=""
    )
    if updated != 1:  # approved (or rejected) by someone else in between
        review.refresh_from_db()
        raise AlreadyDecided(f"change #{change_id} is {review.status}; nothing changed")
    review.refresh_from_db()
    publish(CHANGES_TOPIC, TetherEventType.CHANGE_QUEUED, {**change_payload(review), "by": by})
    _queue_kick()
    return review


def changes_approve(
    *, change_ids: list[int], by: str = "operator"
) -> list[tuple[int, ChangeReview | TetherError]]:
    """Approve several changes into the queue, in the order given: each one's outcome (the
    queued review, or why it was refused). One refusal does not stop the others."""
    outcomes: list[tuple[int, ChangeReview | TetherError]] = []
    for change_id in change_ids:
        try:
            outcomes.append((change_id, change_approve(change_id=change_id, by=by)))
        except TetherError as exc:
            outcomes.append((change_id, exc))
    return outcomes


def changes_approve_low_risk(
    *, by: str = "operator"
) -> list[tuple[int, ChangeReview | TetherError]]:
    """Every pending low-risk change into the queue, oldest first."""
    ids = list(
        ChangeReview.objects.filter(status=ChangeStatus.PENDING, risk=Risk.LOW)
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
    )
    return changes_approve(change_ids=ids, by=by)


# --- the merge queue's transitions (called by tether/services/merge_queue.py) ---


def change_merge_claim(*, repository_id: int | None = None) -> ChangeReview | None:
    """The queue's next entry, now merging: one left merging by a consumer that died first (it
    is resumed), else the earliest approved. Each repository has its queue (`repository_id`;
    None: the queue of every repository as one). The caller holds the queue's lock."""
    while True:
        head = _in_queue(repository_id).order_by("queued_at", "pk").only("pk", "status").first()
        if head is None:
            return None
        if head.status == ChangeStatus.MERGING or (
            ChangeReview.objects.filter(pk=head.pk, status=ChangeStatus.QUEUED).update(
                status=ChangeStatus.MERGING
            )
            == 1
        ):
            review = ChangeReview.objects.get(pk=head.pk)
            publish(CHANGES_TOPIC, TetherEventType.CHANGE_MERGE_STARTED, change_payload(review))
            return review
        # Rejected or superseded in between: look again.


def _merging_update(change_id: int, **fields: object) -> ChangeReview:
    """merging -> whatever `fields` say; TetherError when the entry is no longer merging."""
    if ChangeReview.objects.filter(pk=change_id, status=ChangeStatus.MERGING).update(**fields) != 1:
        raise AlreadyDecided(f"change #{change_id} is no longer merging; nothing recorded")
    return ChangeReview.objects.get(pk=change_id)


def change_merge_intent(*, change_id: int, merge_sha: str) -> None:
    """The merge commit about to become the base: a consumer that dies before recording the
    outcome leaves it here, and the next one finds the base already moved to it."""
    _merging_update(change_id, merge_sha=merge_sha)


@transaction.atomic
def change_merge_done(
    *, change_id: int, merge_sha: str, checks: list[dict[str, object]] | None = None
) -> ChangeReview:
    review = _merging_update(
        change_id,
        status=ChangeStatus.MERGED,
        merge_sha=merge_sha,
        checks=checks or [],
        decided_at=timezone.now(),
    )
    publish(
        CHANGES_TOPIC,
        TetherEventType.CHANGE_MERGED,
        {**change_payload(review), "by": review.decided_by},
    )
    return review


@transaction.atomic
def change_merge_conflicted(*, change_id: int, conflicted: list[str]) -> ChangeReview:
    """The merge onto the current base conflicts: aborted, a correction quantum filed."""
    review = ChangeReview.objects.get(pk=change_id)
    filed = correction_file(
        quantum_id=review.quantum_id,
        title=f"Resolve the merge conflict of #{review.quantum_id} into {review.base}",
        body=(
            f"Change #{review.pk} (branch {review.branch}, {review.head_sha[:10]}) conflicts "
            f"with {review.base}. The merge was aborted; {review.base} is unchanged.\n\n"
            "## Conflicting files\n" + "\n".join(f"- {f}" for f in conflicted)
        ),
        by=review.decided_by or "tether",
    )
    review = _merging_update(
        change_id,
        status=ChangeStatus.CONFLICTED,
        merge_sha="",
        decided_at=timezone.now(),
        comment="conflicts: " + ", ".join(conflicted),
        correction=filed,
    )
    publish(
        CHANGES_TOPIC,
        TetherEventType.CHANGE_CONFLICTED,
        {**change_payload(review), "by": review.decided_by},
    )
    return review


@transaction.atomic
def change_merge_failed(*, change_id: int, report: VerifyReport) -> ChangeReview:
    """The checks failed on the merged result: the base did not move; the quantum is reopened
    with the checks' output as its comment."""
    summary = report.summary()
    review = _merging_update(
        change_id,
        status=ChangeStatus.FAILED,
        merge_sha="",
        checks=[dict(c) for c in report.as_data()],
        decided_at=timezone.now(),
        comment=f"checks failed on the merged result: {summary}",
    )
    try:
        quantum_reopen(
            quantum_id=review.quantum_id,
            reason=(
                f"change #{change_id} was not merged: its checks failed once merged into "
                f"{review.base}.\n\n{summary}"
            ),
        )
    except IllegalTransition as exc:  # an open quantum need not be reopened
        logger.info("tether: quantum %s not reopened: %s", review.quantum_id, exc)
    publish(
        CHANGES_TOPIC,
        TetherEventType.CHANGE_FAILED,
        {**change_payload(review), "by": review.decided_by},
    )
    return review


@transaction.atomic
def change_merge_moved(*, change_id: int, reason: str) -> ChangeReview:
    """The branch moved since the review: back to pending, to be reviewed again."""
    review = _merging_update(
        change_id, status=ChangeStatus.PENDING, queued_at=None, merge_sha="", comment=reason
    )
    publish(CHANGES_TOPIC, TetherEventType.CHANGE_RETURNED, change_payload(review))
    return review


@transaction.atomic
def change_merge_blocked(*, change_id: int, reason: str) -> ChangeReview:
    """The base could not be moved for a reason of its own (its checkout has local changes in
    the way): the entry goes back to the head of the queue, tried again on the next kick."""
    review = _merging_update(change_id, status=ChangeStatus.QUEUED, merge_sha="", comment=reason)
    publish(CHANGES_TOPIC, TetherEventType.CHANGE_BLOCKED, change_payload(review))
    return review


def _in_queue(repository_id: int | None) -> QuerySet[ChangeReview]:
    queued = ChangeReview.objects.filter(status__in=CHANGE_IN_QUEUE)
    return queued if repository_id is None else queued.filter(quantum__repository_id=repository_id)


def changes_queued(*, repository_id: int | None = None) -> bool:
    return _in_queue(repository_id).exists()


def queued_repository_ids() -> list[int]:
    """The repositories whose merge queue holds entries, the earliest entry's first."""
    seen: dict[int, None] = {}
    for rid in (
        ChangeReview.objects.filter(status__in=CHANGE_IN_QUEUE)
        .order_by("queued_at", "pk")
        .values_list("quantum__repository_id", flat=True)
    ):
        seen.setdefault(rid)
    return list(seen)


@transaction.atomic
def change_reject(*, change_id: int, reason: str, by: str = "operator") -> ChangeReview:
    """Nothing is merged; the quantum is reopened with the reason as a comment."""
    if not reason.strip():
        raise InvalidInput("say why the change is rejected (--reason)")
    now = timezone.now()
    updated = ChangeReview.objects.filter(pk=change_id, status=ChangeStatus.PENDING).update(
        status=ChangeStatus.REJECTED, comment=reason.strip(), decided_by=by, decided_at=now
    )
    review = ChangeReview.objects.filter(pk=change_id).first()
    if review is None:
        raise NotFound(f"no change review #{change_id}")
    if updated != 1:
        raise AlreadyDecided(f"change #{change_id} is {review.status}; nothing changed")
    quantum_reopen(
        quantum_id=review.quantum_id, reason=f"change #{change_id} rejected: {reason.strip()}"
    )
    publish(CHANGES_TOPIC, TetherEventType.CHANGE_REJECTED, {**change_payload(review), "by": by})
    return review


@transaction.atomic
def change_forge_closed(*, change_id: int, merged: bool, merge_sha: str, by: str) -> ChangeReview:
    """The change's pull request was merged or closed on its forge: pending or queued -> merged
    (the forge's merge sha) or rejected. A closed pull request is the team's "no": the quantum is
    not reopened. A merging change is left to the queue's consumer (its merge through the forge
    finds the pull request merged and records that)."""
    now = timezone.now()
    fields: dict[str, object] = (
        {"status": ChangeStatus.MERGED, "merge_sha": merge_sha[:40]}
        if merged
        else {"status": ChangeStatus.REJECTED, "comment": f"closed on the forge by {by}"}
    )
    updated = ChangeReview.objects.filter(
        pk=change_id, status__in=(ChangeStatus.PENDING, ChangeStatus.QUEUED)
    ).update(decided_by=by, decided_at=now, **fields)
    review = ChangeReview.objects.filter(pk=change_id).first()
    if review is None:
        raise NotFound(f"no change review #{change_id}")
    if updated != 1:
        raise AlreadyDecided(f"change #{change_id} is {review.status}; nothing changed")
    verb = "change_merged" if merged else "change_rejected"
    publish("tether:drifts", verb, {**change_payload(review), "by": by})
    return review
