"""Pull requests on a forge: configured per repository, published from change reviews, and
brought back (reviews, checks, merges, closes) by the webhook or the poll. The one writer of
ForgeRepository and PullRequest.

The forge is the truth and every step reads it again: a webhook delivery only says which pull
request to look at (`pull_request_sync` reads its reviews and checks from the API), so a
redelivery, a poll and a delivery that arrives out of order all end in the same state, and what
was acted on (`PullRequest.acted`) is acted on once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.events import publish
from core.redaction import redact
from forges.base import CheckNote, Forge, PullView, ReviewNote
from forges.body import pull_body, pull_title, risk_labels
from forges.errors import ForgeError, ForgeNotConfigured, ForgeRefused, ForgeUnavailable
from forges.events import TOPIC, ForgeEventType
from forges.models import CREDENTIAL_PATTERN, SLUG_PATTERN, ForgeRepository, PullRequest, PullState
from psychonauts.workspaces.repository import repo_local, repo_url
from quanta.models import Quantum
from repos.context import working_on_id
from repos.models import Repository
from tether.errors import TetherError
from tether.models import ChangeReview, ChangeStatus
from tether.services.changes import change_approve, change_forge_closed, change_reject

logger = logging.getLogger(__name__)

PUBLISH_TASK = "forges.pull_request_publish"
SYNC_TASK = "forges.pull_request_sync"
FAILED = frozenset({"failure", "timed_out", "cancelled", "action_required", "startup_failure"})
PASSED = frozenset({"success", "neutral", "skipped"})
REASON_LIMIT = 20_000

# The forge client of a configuration; tests and a GitLab client register theirs by kind.
FORGES: dict[str, Callable[[ForgeRepository], Forge]] = {}


def forge_for(config: ForgeRepository) -> Forge:
    if not config.push_url:
        # Branches already reach the forge through the central repository.
        with working_on_id(config.repository_id):
            config.push_url = repo_url()
    factory = FORGES.get(config.kind)
    if factory is None:
        from forges.github import GitHubForge  # the client library only where a forge is used

        factory = GitHubForge
    return factory(config)


# --- configuration ------------------------------------------------------------------------------


@transaction.atomic
def forge_configure(
    *,
    repository_id: int,
    slug: str,
    token_env: str = "",
    app_id: str = "",
    installation_id: int | None = None,
    key_env: str = "",
    api_url: str = "https://api.github.com",
    push_url: str = "",
    required_checks: list[str] | None = None,
    merge_method: str = "merge",
    webhook: bool = True,
) -> ForgeRepository:
    """The repository publishes its changes as pull requests on `slug` (set again: replaced).
    The credential is named, never given: an environment variable of the workers."""
    import re

    if not re.fullmatch(SLUG_PATTERN, slug):
        raise ForgeNotConfigured(f"{slug!r} is not owner/name")
    for name in (token_env, key_env):
        if name and not re.fullmatch(CREDENTIAL_PATTERN, name):
            raise ForgeNotConfigured(
                f"{name!r}: name an environment variable in capitals ending in _TOKEN or _KEY "
                "(so that its value is redacted everywhere)"
            )
    if not token_env and not (app_id and installation_id and key_env):
        raise ForgeNotConfigured(
            "give a token's variable, or a GitHub App's id, installation and key"
        )
    if merge_method not in ("merge", "squash", "rebase"):
        raise ForgeNotConfigured(f"merge method {merge_method!r} is not merge, squash or rebase")
    if not Repository.objects.filter(pk=repository_id, removed_at__isnull=True).exists():
        raise ForgeNotConfigured(f"no repository #{repository_id}")
    config, _ = ForgeRepository.objects.update_or_create(
        repository_id=repository_id,
        defaults={
            "slug": slug,
            "token_env": token_env,
            "app_id": app_id,
            "installation_id": installation_id,
            "key_env": key_env,
            "api_url": api_url,
            "push_url": push_url,
            "required_checks": required_checks or [],
            "merge_method": merge_method,
            "webhook": webhook,
        },
    )
    return config


def forge_remove(*, repository_id: int) -> bool:
    """Back to merging locally. Pull requests already open stay on the forge."""
    return ForgeRepository.objects.filter(repository_id=repository_id).delete()[0] > 0


# --- publishing ---------------------------------------------------------------------------------


def pull_request_mark(review: ChangeReview) -> PullRequest | None:
    """A new review of a forge repository's branch: its pull request (the branch's live one, or
    a new row) is to be published, by a task sent after commit. None: the repository merges
    locally. Runs in the review's transaction."""
    repository_id = Quantum.objects.values_list("repository_id", flat=True).get(
        pk=review.quantum_id
    )
    if not ForgeRepository.objects.filter(repository_id=repository_id).exists():
        return None
    live = (
        PullRequest.objects.select_for_update()
        .filter(repository_id=repository_id, branch=review.branch)
        .exclude(state__in=PullState.terminal())
        .first()
    )
    if live is None:
        pull = PullRequest.objects.create(
            repository_id=repository_id, branch=review.branch, base=review.base, change=review
        )
    else:
        PullRequest.objects.filter(pk=live.pk).update(
            change=review, base=review.base, state=PullState.PUBLISHING, error=""
        )
        pull = PullRequest.objects.get(pk=live.pk)

    def send() -> None:
        from core.celery import app  # the Celery application only where a task is sent

        app.send_task(PUBLISH_TASK, args=(pull.pk,))

    transaction.on_commit(send)
    return pull


def pull_request_publish(*, pull_id: int) -> PullRequest | None:
    """Push the branch at its review's head and open (or find, or update) its pull request,
    with the review's summary and its risk label. Idempotent: run again after a crash anywhere
    in it, it opens no second pull request. ForgeUnavailable: try again later (the error is
    recorded); ForgeRefused: the pull request is `failed` with the forge's words."""
    pull = (
        PullRequest.objects.select_related("change", "change__quantum").filter(pk=pull_id).first()
    )
    if pull is None or pull.state in PullState.terminal():
        return pull
    review = pull.change
    config = ForgeRepository.objects.filter(repository_id=pull.repository_id).first()
    try:
        if config is None:
            raise ForgeNotConfigured("the repository no longer publishes pull requests")
        forge = forge_for(config)
        with working_on_id(pull.repository_id):
            forge.branch_push(repo=repo_local(), branch=pull.branch, sha=review.head_sha)
        title, body = pull_title(review, review.quantum), pull_body(review, review.quantum)
        number = pull.number
        if number is None:
            # After a crash between the push (or the opening) and recording the number, the
            # forge has the pull request: found, not opened twice.
            view = forge.pull_find(branch=pull.branch) or forge.pull_open(
                branch=pull.branch, base=pull.base, title=title, body=body
            )
            number = view.number
            PullRequest.objects.filter(pk=pull.pk).update(number=number, url=view.url)
        view = forge.pull_update(number=number, title=title, body=body, labels=risk_labels(review))
    except (ForgeRefused, ForgeNotConfigured) as exc:
        return _publish_failed(pull, exc)
    except ForgeUnavailable as exc:
        PullRequest.objects.filter(pk=pull.pk).update(error=redact(str(exc))[:2000])
        raise
    PullRequest.objects.filter(pk=pull.pk, change_id=review.pk).update(
        state=PullState.OPEN,
        number=view.number,
        url=view.url,
        head_sha=review.head_sha,
        error="",
        synced_at=timezone.now(),  # read just now: the poll's clock starts here
    )
    pull.refresh_from_db()
    publish(TOPIC, ForgeEventType.PULL_REQUEST_PUBLISHED, _payload(pull))
    return pull


def _publish_failed(pull: PullRequest, exc: ForgeError) -> PullRequest:
    error = redact(str(exc))[:2000]
    PullRequest.objects.filter(pk=pull.pk, state=PullState.PUBLISHING).update(
        state=PullState.FAILED, error=error
    )
    logger.warning("forges: pull request of %s not published: %s", pull.branch, error)
    pull.refresh_from_db()
    publish(TOPIC, ForgeEventType.PULL_REQUEST_FAILED, {**_payload(pull), "error": error})
    return pull


def _payload(pull: PullRequest) -> dict[str, Any]:
    return {
        "pull_request_id": pull.pk,
        "change_id": pull.change_id,
        "branch": pull.branch,
        "number": pull.number,
        "url": pull.url,
        "state": pull.state,
    }


# --- coming back --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synced:
    """What one look at the forge did, in words."""

    pull_id: int
    outcome: str


def pull_request_sync(*, pull_id: int) -> Synced:
    """Read the pull request on the forge and act: merged there -> the change merged; closed
    -> rejected; new changes requested or review comments, or a failed check -> the change
    rejected and its quantum reopened with them as the reason; approved on the head with every
    required check green -> approved into our merge queue (which verifies, then merges through
    the forge)."""
    pull = PullRequest.objects.select_related("change").filter(pk=pull_id).first()
    if pull is None or pull.state != PullState.OPEN or pull.number is None:
        return Synced(pull_id, "nothing to look at")
    config = ForgeRepository.objects.filter(repository_id=pull.repository_id).first()
    if config is None:
        return Synced(pull_id, "the repository no longer publishes pull requests")
    try:
        view = forge_for(config).pull_view(number=pull.number)
    except (ForgeRefused, ForgeNotConfigured) as exc:
        PullRequest.objects.filter(pk=pull.pk).update(error=redact(str(exc))[:2000])
        return Synced(pull_id, f"not read: {exc}")
    outcome = _act(pull, config, view)
    logger.info("forges: pull request %s of %s: %s", view.number, config.slug, outcome)
    return Synced(pull_id, outcome)


@transaction.atomic
def _act(pull: PullRequest, config: ForgeRepository, view: PullView) -> str:
    pull = PullRequest.objects.select_for_update().select_related("change").get(pk=pull.pk)
    if pull.state != PullState.OPEN:
        return f"already {pull.state}"
    review = pull.change
    acted = set(pull.acted)
    now = timezone.now()
    if view.merged or view.state == "closed":
        state = PullState.MERGED if view.merged else PullState.CLOSED
        by = f"{config.kind}:{view.closed_by}" if view.closed_by else config.kind
        try:
            change_forge_closed(
                change_id=review.pk, merged=view.merged, merge_sha=view.merge_sha, by=by
            )
        except TetherError as exc:
            logger.info("forges: change %s not closed: %s", review.pk, exc)
        PullRequest.objects.filter(pk=pull.pk, state=PullState.OPEN).update(
            state=state, synced_at=now
        )
        event = (
            ForgeEventType.PULL_REQUEST_MERGED
            if view.merged
            else ForgeEventType.PULL_REQUEST_CLOSED
        )
        publish(TOPIC, event, {**_payload(pull), "state": state})
        return f"{state} on the forge"
    if view.head_sha != review.head_sha:
        PullRequest.objects.filter(pk=pull.pk).update(synced_at=now)
        return f"head {view.head_sha[:10]} is not the reviewed {review.head_sha[:10]}; waiting"
    considered = _considered(view.checks, config.required_checks)
    feedback = [
        r for r in view.reviews
        if str(r.id) not in acted and r.commit_sha == view.head_sha and _asks(r)
    ]  # fmt: skip
    failed = [
        c for c in considered
        if c.conclusion in FAILED and f"{c.name}@{view.head_sha}" not in acted
    ]  # fmt: skip
    outcome = "nothing new"
    if (feedback or failed) and review.status == ChangeStatus.PENDING:
        reason = _reason(view, feedback, failed)
        change_reject(change_id=review.pk, reason=reason, by=_by(config, feedback, failed))
        acted |= {str(r.id) for r in feedback} | {f"{c.name}@{view.head_sha}" for c in failed}
        outcome = f"change #{review.pk} sent back: {len(feedback)} reviews, {len(failed)} checks"
    elif view.handed:
        outcome = "in the forge's merge queue"
    elif review.status == ChangeStatus.PENDING:
        approvers = _approvers(view)
        if approvers and _green(considered, config.required_checks):
            try:
                change_approve(change_id=review.pk, by=f"{config.kind}:{approvers[0]}")
                outcome = f"change #{review.pk} approved by {', '.join(approvers)}: queued"
            except TetherError as exc:
                outcome = f"approved on the forge, not queued: {exc}"
    PullRequest.objects.filter(pk=pull.pk).update(acted=sorted(acted), synced_at=now)
    return outcome


def _asks(review: ReviewNote) -> bool:
    if review.verdict == "changes_requested":
        return True
    return review.verdict == "commented" and bool(review.body.strip() or review.comments)


def _considered(checks: tuple[CheckNote, ...], required: list[str]) -> list[CheckNote]:
    return [c for c in checks if c.name in required] if required else list(checks)


def _green(considered: list[CheckNote], required: list[str]) -> bool:
    """Every considered check completed and passed, and every required one is there."""
    if any(c.status != "completed" or c.conclusion not in PASSED for c in considered):
        return False
    return set(required) <= {c.name for c in considered}


def _approvers(view: PullView) -> list[str]:
    """Who approved the head commit, when nobody's latest verdict asks for changes."""
    latest: dict[str, ReviewNote] = {}
    for review in view.reviews:
        if review.verdict in ("approved", "changes_requested", "dismissed"):
            latest[review.user] = review
    if any(r.verdict == "changes_requested" for r in latest.values()):
        return []
    return sorted(
        user
        for user, r in latest.items()
        if r.verdict == "approved" and r.commit_sha == view.head_sha
    )


def _by(config: ForgeRepository, feedback: list[ReviewNote], failed: list[CheckNote]) -> str:
    return f"{config.kind}:{feedback[0].user}" if feedback else f"{config.kind}:checks"


def _reason(view: PullView, feedback: list[ReviewNote], failed: list[CheckNote]) -> str:
    parts = [f"pull request #{view.number} ({view.url}):"]
    for review in feedback:
        verb = "requested changes" if review.verdict == "changes_requested" else "commented"
        parts.append(f"\n{review.user} {verb}:\n{review.body.strip() or '(no summary)'}")
        parts += [f"- {comment}" for comment in review.comments]
    for check in failed:
        parts.append(f"\nThe check `{check.name}` concluded {check.conclusion} ({check.url}):")
        parts.append(check.summary.strip() or "(no output)")
    return redact("\n".join(parts))[:REASON_LIMIT]


# --- the merge queue's merge --------------------------------------------------------------------


@dataclass(frozen=True)
class ForgeMerge:
    """The merge queue's answer from the forge: merged (`sha`), or declined (`reason`: the
    change goes back to pending; a merge handed to the forge's own queue is one)."""

    sha: str = ""
    reason: str = ""


def pull_request_merge(*, change_id: int) -> ForgeMerge | None:
    """Merge the change's pull request through the forge (its head still the reviewed one).
    None: the change's repository merges locally. ForgeUnavailable propagates (retried on
    the queue's next kick)."""
    review = ChangeReview.objects.select_related("quantum").get(pk=change_id)
    rid = review.quantum.repository_id
    config = ForgeRepository.objects.filter(repository_id=rid).first() if rid else None
    if config is None:
        return None
    pull = (
        PullRequest.objects.filter(change_id=change_id)
        .filter(Q(state=PullState.OPEN) | Q(state=PullState.MERGED))
        .first()
    )
    if pull is None or pull.number is None:
        return ForgeMerge(reason=f"change #{change_id} has no open pull request on {config.slug}")
    try:
        outcome = forge_for(config).pull_merge(
            number=pull.number, sha=review.head_sha, method=config.merge_method
        )
    except (ForgeRefused, ForgeNotConfigured) as exc:
        return ForgeMerge(reason=f"{config.slug} did not merge #{pull.number}: {exc}")
    if outcome.queued:
        return ForgeMerge(
            reason=f"handed to {config.slug}'s merge queue: merged when the forge merges it"
        )
    if not outcome.merged:
        return ForgeMerge(reason=f"{config.slug} did not merge #{pull.number}")
    PullRequest.objects.filter(pk=pull.pk, state=PullState.OPEN).update(
        state=PullState.MERGED, synced_at=timezone.now()
    )
    return ForgeMerge(sha=outcome.sha)


# --- deliveries and the poll --------------------------------------------------------------------


def github_delivery(event: str, payload: dict[str, Any]) -> str | None:
    """A GitHub delivery about one of our pull requests: its sync sent after commit, and the
    outcome in words; None when the delivery is not about one (the caller acts on it)."""
    repository = payload.get("repository")
    slug = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(slug, str):
        return None
    configs = list(
        ForgeRepository.objects.filter(slug__iexact=slug).values_list("repository_id", flat=True)
    )
    if not configs:
        return None
    live = PullRequest.objects.filter(repository_id__in=configs, state=PullState.OPEN)
    numbers: list[int] = []
    shas: list[str] = []
    pr = payload.get("pull_request")
    if isinstance(pr, dict) and isinstance(pr.get("number"), int):
        numbers.append(pr["number"])
    run = payload.get(event) if event in ("check_run", "check_suite") else None
    if isinstance(run, dict):
        for item in run.get("pull_requests") or []:
            if isinstance(item, dict) and isinstance(item.get("number"), int):
                numbers.append(item["number"])
        if isinstance(run.get("head_sha"), str):
            shas.append(run["head_sha"])
    if not numbers and not shas:
        return None
    ids = list(
        live.filter(Q(number__in=numbers) | Q(head_sha__in=shas)).values_list("pk", flat=True)
    )
    if not ids:
        return None
    _syncs_send(ids)
    return f"pull requests {', '.join(map(str, ids))} of {slug}: looked at again"


def pull_requests_due(*, limit: int = 200) -> list[int]:
    """The poll: open pull requests not looked at for settings.FORGES_POLL_S where no deliveries
    come (a repository set without a webhook, or every one while no webhook secret is set), and
    for settings.FORGES_WEBHOOK_POLL_S where they do (a delivery GitHub failed to make, or one
    that came while the pull request was being published); each one's sync sent."""
    now = timezone.now()
    polled = PullRequest.objects.filter(state=PullState.OPEN, number__isnull=False)
    stale = Q(synced_at__isnull=True) | Q(
        synced_at__lt=now - timedelta(seconds=settings.FORGES_POLL_S)
    )
    if settings.HOOKS_GITHUB_SECRET:
        delivered = ForgeRepository.objects.filter(webhook=True).values_list("repository_id")
        long_ago = now - timedelta(seconds=settings.FORGES_WEBHOOK_POLL_S)
        stale &= ~Q(repository_id__in=delivered) | Q(synced_at__lt=long_ago)
    ids = list(polled.filter(stale).order_by("synced_at").values_list("pk", flat=True)[:limit])
    _syncs_send(ids)
    return ids


def _syncs_send(ids: list[int]) -> None:
    def send() -> None:
        from core.celery import app  # the Celery application only where a task is sent

        for pull_id in ids:
            app.send_task(SYNC_TASK, args=(pull_id,))

    if ids:
        transaction.on_commit(send)
