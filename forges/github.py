"""GitHub behind the forge interface, through PyGithub (REST v3).

Calls are rate-limited per forge repository (a token bucket in Redis shared by every worker,
settings.FORGES_RATE_*) and retried with exponential backoff by the client (5xx, connection
errors, and 403s that GitHub marks as rate limits: GithubRetry waits out the reset it names).
What is left after those retries is a ForgeUnavailable (the task retries it later) or a
ForgeRefused (the operator must act). The credential lives in the worker's environment only.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import requests
from django.conf import settings
from github import Auth, Github, GithubException, GithubRetry, RateLimitExceededException
from github.PullRequest import PullRequest as GhPull

from core.ratelimit import Rate, rate_take
from core.redaction import redact
from forges.base import CheckNote, MergeOutcome, PullView, ReviewNote, ReviewVerdict
from forges.errors import ForgeNotConfigured, ForgeRefused, ForgeUnavailable
from forges.models import ForgeRepository
from psychonauts.workspaces.git import git_command

logger = logging.getLogger(__name__)

T = TypeVar("T")
RISK_LABEL = "risk:"
VERDICTS: dict[str, ReviewVerdict] = {
    "APPROVED": "approved",
    "CHANGES_REQUESTED": "changes_requested",
    "COMMENTED": "commented",
    "DISMISSED": "dismissed",
    "PENDING": "pending",
}


def credential(config: ForgeRepository) -> Auth.Auth:
    """The repository's credential from this worker's environment (ForgeNotConfigured when the
    variable is unset: the message names the variable, never a value)."""
    if config.token_env:
        token = os.environ.get(config.token_env, "")
        if not token:
            raise ForgeNotConfigured(f"{config.slug}: {config.token_env} is not set on this worker")
        return Auth.Token(token)
    if config.app_id and config.installation_id and config.key_env:
        key = os.environ.get(config.key_env, "")
        if not key:
            raise ForgeNotConfigured(f"{config.slug}: {config.key_env} is not set on this worker")
        app = Auth.AppAuth(config.app_id, key)
        return app.get_installation_auth(int(config.installation_id))
    raise ForgeNotConfigured(f"{config.slug}: neither a token nor a GitHub App is configured")


class GitHubForge:
    """One forge repository, one client (its HTTP session is reused across calls)."""

    def __init__(self, config: ForgeRepository, *, auth: Auth.Auth | None = None) -> None:
        self.config = config
        self.owner = config.slug.split("/", 1)[0]
        self._auth = auth or credential(config)
        retry = GithubRetry(
            total=settings.FORGES_RETRIES,
            backoff_factor=settings.FORGES_BACKOFF_S,
            max_rate_limit_wait=settings.FORGES_MAX_RATE_WAIT_S,
            raise_on_status=False,  # the last answer reaches us, with its status and message
        )
        self._client = Github(
            base_url=config.api_url.rstrip("/"),
            auth=self._auth,
            retry=retry,
            timeout=int(settings.FORGES_TIMEOUT_S),
            per_page=100,
            # Our own bucket paces requests across every worker (_call).
            seconds_between_requests=None,
            seconds_between_writes=None,
            lazy=True,
        )
        self._repo = self._client.get_repo(config.slug)

    # --- the interface -------------------------------------------------------------------------

    def branch_push(self, *, repo: Path, branch: str, sha: str) -> None:
        url = self.config.push_url
        if not url:
            raise ForgeNotConfigured(f"{self.config.slug}: no push URL and no central repository")
        self._throttle()
        command = git_command(
            "push", "--force", "--quiet", url, f"{sha}:refs/heads/{branch}", cwd=repo
        )
        env = dict(command.env)
        token = self._token()
        if token and url.startswith("https://"):
            # The header goes through git's environment, not its command line (visible to ps).
            basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
            env.update(
                GIT_CONFIG_COUNT="1",
                GIT_CONFIG_KEY_0="http.extraHeader",
                GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}",
            )
        delay = settings.FORGES_BACKOFF_S
        for attempt in range(settings.FORGES_RETRIES + 1):
            proc = subprocess.run(
                command.argv, cwd=repo, env=env, capture_output=True, text=True, check=False,
                timeout=settings.FORGES_TIMEOUT_S * 4,
            )  # fmt: skip
            if proc.returncode == 0:
                return
            complaint = redact(proc.stderr.strip())[-500:]
            if "403" in complaint or "denied" in complaint.lower():
                raise ForgeRefused(f"push of {branch} refused: {complaint}", status=403)
            if attempt < settings.FORGES_RETRIES:
                time.sleep(delay)
                delay *= 2
        raise ForgeUnavailable(f"push of {branch} failed: {complaint}")

    def pull_find(self, *, branch: str) -> PullView | None:
        def find() -> PullView | None:
            for pull in self._repo.get_pulls(state="open", head=f"{self.owner}:{branch}"):
                if pull.head.ref == branch:
                    return self._view(pull)
            return None

        return self._call("find a pull request", find)

    def pull_open(self, *, branch: str, base: str, title: str, body: str) -> PullView:
        try:
            pull = self._call(
                "open a pull request",
                lambda: self._repo.create_pull(base=base, head=branch, title=title, body=body),
            )
        except ForgeRefused as exc:
            # 422 "A pull request already exists": another publisher won; adopt its pull request.
            found = self.pull_find(branch=branch) if exc.status == 422 else None
            if found is None:
                raise
            return found
        return self._view(pull)

    def pull_update(self, *, number: int, title: str, body: str, labels: list[str]) -> PullView:
        pull = self._call("read the pull request", lambda: self._repo.get_pull(number))
        if pull.title != title or (pull.body or "") != body:
            self._call("update the pull request", lambda: pull.edit(title=title, body=body))
        view = self._view(pull)
        want = sorted({name for name in view.labels if not name.startswith(RISK_LABEL)} | {*labels})
        if sorted(set(view.labels)) != want:
            self._call("set the labels", lambda: pull.set_labels(*want))
            view = replace(view, labels=tuple(want))
        return view

    def pull_view(self, *, number: int) -> PullView:
        pull = self._call("read the pull request", lambda: self._repo.get_pull(number))

        def notes() -> tuple[tuple[ReviewNote, ...], tuple[CheckNote, ...]]:
            comments: dict[int, list[str]] = {}
            for comment in pull.get_review_comments():
                where = f"{comment.path}:{comment.line or comment.original_line or ''}"
                comments.setdefault(comment.pull_request_review_id or 0, []).append(
                    f"{where}: {comment.body}"
                )
            reviews = tuple(
                ReviewNote(
                    id=review.id,
                    user=review.user.login if review.user else "",
                    verdict=VERDICTS.get(review.state, "commented"),
                    body=review.body or "",
                    commit_sha=review.commit_id or "",
                    comments=tuple(comments.get(review.id, ())),
                )
                for review in pull.get_reviews()
            )
            checks = tuple(
                CheckNote(
                    name=run.name,
                    status=run.status,
                    conclusion=run.conclusion or "",
                    summary="\n\n".join(
                        part
                        for part in (run.output.title, run.output.summary, run.output.text)
                        if part
                    )
                    if run.output
                    else "",
                    url=run.html_url or "",
                )
                for run in self._repo.get_commit(pull.head.sha).get_check_runs()
            )
            return reviews, checks

        reviews, checks = self._call("read reviews and checks", notes)
        view = self._view(pull)
        return PullView(**{**view.__dict__, "reviews": reviews, "checks": checks})

    def pull_merge(self, *, number: int, sha: str, method: str) -> MergeOutcome:
        pull = self._call("read the pull request", lambda: self._repo.get_pull(number))
        if pull.merged:
            return MergeOutcome(merged=True, sha=pull.merge_commit_sha or "")
        try:
            status = self._call(
                "merge the pull request", lambda: pull.merge(merge_method=method, sha=sha)
            )
        except ForgeRefused as exc:
            if exc.status == 405 and "merge queue" in str(exc).lower():
                # The base branch requires GitHub's merge queue: hand the pull request to it
                # (auto-merge enqueues it once its requirements pass).
                self._call(
                    "enqueue in the merge queue", lambda: pull.enable_automerge(method.upper())
                )
                return MergeOutcome(merged=False, queued=True)
            raise
        return MergeOutcome(merged=bool(status.merged), sha=status.sha or "")

    # --- plumbing ------------------------------------------------------------------------------

    def _token(self) -> str:
        token = getattr(self._auth, "token", "")
        return token if isinstance(token, str) else ""

    def _throttle(self) -> None:
        """Wait for our bucket (every worker shares it): GitHub's secondary limits punish
        bursts of writes with 403s that last minutes."""
        rate = Rate(settings.FORGES_RATE_CAPACITY, settings.FORGES_RATE_PERIOD_S)
        key = f"forge:{self.config.kind}:{self.config.slug}"
        while True:
            decision = rate_take(key=key, rate=rate)
            if decision.allowed:
                return
            if decision.retry_after_s > settings.FORGES_MAX_RATE_WAIT_S:
                raise ForgeUnavailable(
                    f"{self.config.slug}: our rate limit is spent",
                    retry_after_s=decision.retry_after_s,
                )
            time.sleep(decision.retry_after_s)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        self._throttle()
        try:
            return call()
        except RateLimitExceededException as exc:
            raise ForgeUnavailable(
                f"could not {what}: GitHub's rate limit ({_message(exc)})",
                retry_after_s=_reset_in(exc.headers),
            ) from None
        except GithubException as exc:
            message = f"could not {what}: GitHub answered {exc.status} ({_message(exc)})"
            if exc.status >= 500 or exc.status == 429:
                raise ForgeUnavailable(message) from None
            raise ForgeRefused(message, status=exc.status) from None
        except requests.RequestException as exc:
            raise ForgeUnavailable(f"could not {what}: {redact(str(exc))[:300]}") from None

    def _view(self, pull: GhPull) -> PullView:
        merged_by = pull.merged_by.login if pull.merged and pull.merged_by else ""
        return PullView(
            number=pull.number,
            url=pull.html_url or "",
            state="closed" if pull.state == "closed" else "open",
            merged=bool(pull.merged),
            merge_sha=(pull.merge_commit_sha or "") if pull.merged else "",
            head_sha=pull.head.sha,
            base=pull.base.ref,
            labels=tuple(label.name for label in pull.labels),
            closed_by=merged_by,
            handed=bool(pull.auto_merge),
        )


def _message(exc: GithubException) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    parts = [str(data.get("message") or "")]
    for error in data.get("errors") or []:
        if isinstance(error, dict):
            parts.append(str(error.get("message") or error.get("code") or ""))
    return redact("; ".join(p for p in parts if p))[:500] or "no message"


def _reset_in(headers: Any) -> float:
    try:
        return max(0.0, float(headers.get("x-ratelimit-reset")) - time.time())
    except (TypeError, ValueError, AttributeError):
        return 60.0
