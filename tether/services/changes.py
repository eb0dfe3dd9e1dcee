"""Grounding of code changes: a review per quantum run that left commits, then approve (merge
into the base branch), reject (reopen the quantum) or a conflict (a correction quantum)."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from bursts.models import QuantumRun
from core.events import publish
from core.redaction import redact
from psychonauts.errors import WorkspaceError
from psychonauts.workspaces import branch_for, git, git_run, registry_lock, repo_lock
from quanta.models import Dependency, DependencyKind
from quanta.services import quantum_reopen
from tether.errors import AlreadyDecided, BranchMoved, InvalidInput, NotFound, TetherError
from tether.models import ChangeReview, ChangeStatus, Risk
from tether.risk import FileChange, RiskVerdict, risk_assess
from tether.services.corrections import correction_file
from tether.services.drifts import drift_built_on_set

logger = logging.getLogger(__name__)

AUTO = "auto (low risk)"


def _repo() -> Path:
    return Path(settings.ANNIHILATION_REPO)


def _repo_lock() -> AbstractContextManager[None]:
    """Merges into the target repository one at a time (git's index lock would refuse)."""
    return repo_lock("merge")


def _sha(ref: str) -> str:
    proc = git_run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=_repo())
    return proc.stdout.strip() if proc.returncode == 0 else ""


def target_branch() -> str:
    """TETHER_TARGET_BRANCH, or the branch the target repository has checked out."""
    return settings.TETHER_TARGET_BRANCH or git("symbolic-ref", "--short", "HEAD", cwd=_repo())


def _files(base: str, head: str) -> list[FileChange]:
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


def change_payload(review: ChangeReview) -> dict[str, object]:
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


@transaction.atomic
def change_review_create(*, quantum_run_id: int) -> ChangeReview | None:
    """Review what a finished run left on its quantum's branch (None when there is nothing).

    Idempotent per run. An older pending review of the same quantum is superseded: the new diff
    against the base contains it.
    """
    existing = ChangeReview.objects.filter(quantum_run_id=quantum_run_id).first()
    if existing is not None:
        return existing
    if not (_repo() / ".git").exists():
        return None  # no target repository (an executor that writes no code)
    run = QuantumRun.objects.only("quantum_id", "branch").get(pk=quantum_run_id)
    branch = run.branch or branch_for(run.quantum_id)
    head = _sha(branch)
    if not head:
        return None  # shared-tree mode, or the agents changed nothing
    base = target_branch()
    if not _sha(base) or git("rev-list", "--count", f"{base}..{head}", cwd=_repo()) == "0":
        return None
    diff = git("diff", f"{base}...{head}", cwd=_repo())
    files = _files(base, head)
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
    except IntegrityError:
        return ChangeReview.objects.get(quantum_run_id=quantum_run_id)
    _record_built_on(review)
    publish("tether:drifts", "change_review_created", change_payload(review))
    if review.risk == Risk.LOW and settings.TETHER_AUTO_MERGE_LOW_RISK:
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


def _worktree_of(branch: str) -> Path | None:
    """Where the branch is checked out (git refuses a second checkout of it), if anywhere."""
    current: Path | None = None
    for line in git("worktree", "list", "--porcelain", cwd=_repo()).splitlines():
        if line.startswith("worktree "):
            current = Path(line.removeprefix("worktree "))
        elif line == f"branch refs/heads/{branch}":
            return current
    return None


def _merge(review: ChangeReview) -> tuple[str, list[str]]:
    """Merge the reviewed sha into the base: (merge sha, []) or ("", conflicting files)."""
    # Exclusive: listing worktrees fails on the half-written record of one being added.
    with registry_lock(shared=False):
        where = _worktree_of(review.base)
        temporary = where is None
        if where is None:
            where = Path(settings.ANNIHILATION_HOME) / "merges" / f"change-{review.pk}"
            where.parent.mkdir(parents=True, exist_ok=True)
            git("worktree", "add", "-q", str(where), review.base, cwd=_repo())
    try:
        message = f"Merge {review.branch} (change #{review.pk}, quantum #{review.quantum_id})"
        proc = git_run(
            *("merge", "--no-ff", "--no-edit", "-m", message, review.head_sha),
            cwd=where,
            env={
                "PATH": "/usr/bin:/bin:/usr/local/bin",
                "GIT_AUTHOR_NAME": "Annihilation Tether",
                "GIT_AUTHOR_EMAIL": "tether@annihilation.invalid",
                "GIT_COMMITTER_NAME": "Annihilation Tether",
                "GIT_COMMITTER_EMAIL": "tether@annihilation.invalid",
                "HOME": str(where),
            },
        )
        if proc.returncode == 0:
            return git("rev-parse", "HEAD", cwd=where), []
        conflicted = git("diff", "--name-only", "--diff-filter=U", cwd=where).splitlines()
        git_run("merge", "--abort", cwd=where)
        if not conflicted:
            raise TetherError(f"git merge failed: {(proc.stderr or proc.stdout).strip()}")
        return "", conflicted
    finally:
        if temporary:
            with registry_lock(shared=False):  # as above: removing reads the list too
                git_run("worktree", "remove", "--force", str(where), cwd=_repo())


@transaction.atomic
def change_approve(*, change_id: int, by: str = "operator") -> ChangeReview:
    """Merge the reviewed head into the base branch. The branch must still point at the sha
    that was reviewed (moved or vanished: BranchMoved, nothing changed). A conflict aborts the
    merge, marks the review conflicted and files a correction quantum."""
    # The row lock makes a second approve wait for the first and then see it decided.
    review = ChangeReview.objects.select_for_update().filter(pk=change_id).first()
    if review is None:
        raise NotFound(f"no change review #{change_id}")
    if review.status != ChangeStatus.PENDING:
        raise AlreadyDecided(f"change #{change_id} is {review.status}; nothing changed")
    with _repo_lock():
        now_sha = _sha(review.branch)
        if now_sha != review.head_sha:
            state = f"now at {now_sha[:10]}" if now_sha else "deleted"
            raise BranchMoved(
                f"change #{change_id}: branch {review.branch} moved since the review (reviewed "
                f"{review.head_sha[:10]}, {state}); nothing merged. Review the new commits first."
            )
        if not _sha(review.base):
            raise BranchMoved(f"change #{change_id}: base branch {review.base} is gone")
        try:
            merge_sha, conflicted = _merge(review)
        except WorkspaceError as exc:
            raise TetherError(f"change #{change_id}: {exc}") from None
    now = timezone.now()
    if merge_sha:
        ChangeReview.objects.filter(pk=change_id, status=ChangeStatus.PENDING).update(
            status=ChangeStatus.MERGED, merge_sha=merge_sha, decided_by=by, decided_at=now
        )
        review.refresh_from_db()
        publish("tether:drifts", "change_merged", {**change_payload(review), "by": by})
        return review
    filed = correction_file(
        quantum_id=review.quantum_id,
        title=f"Resolve the merge conflict of #{review.quantum_id} into {review.base}",
        body=(
            f"Change #{review.pk} (branch {review.branch}, {review.head_sha[:10]}) conflicts "
            f"with {review.base}. The merge was aborted; {review.base} is unchanged.\n\n"
            "## Conflicting files\n" + "\n".join(f"- {f}" for f in conflicted)
        ),
        by=by,
    )
    ChangeReview.objects.filter(pk=change_id, status=ChangeStatus.PENDING).update(
        status=ChangeStatus.CONFLICTED,
        decided_by=by,
        decided_at=now,
        comment="conflicts: " + ", ".join(conflicted),
        correction=filed,
    )
    review.refresh_from_db()
    publish("tether:drifts", "change_conflicted", {**change_payload(review), "by": by})
    return review


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
    publish("tether:drifts", "change_rejected", {**change_payload(review), "by": by})
    return review
