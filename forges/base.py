"""The forge interface: what the services need from GitHub (and what a GitLab client would
implement: merge requests, approvals, pipelines map onto the same few calls).

Every call is idempotent where the forge allows it: pushing the same sha twice is a no-op,
`pull_find` adopts the pull request a crashed publisher opened, labels are set as a whole.
Errors are forges.errors: ForgeRefused (do not retry), ForgeUnavailable (retry later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

ReviewVerdict = Literal["approved", "changes_requested", "commented", "dismissed", "pending"]


@dataclass(frozen=True)
class ReviewNote:
    """A submitted review and its line comments."""

    id: int
    user: str
    verdict: ReviewVerdict
    body: str
    commit_sha: str
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckNote:
    """A check on the pull request's head commit. `conclusion` is "" while it runs."""

    name: str
    status: str
    conclusion: str
    summary: str = ""
    url: str = ""


@dataclass(frozen=True)
class PullView:
    """A pull request as the forge sees it now."""

    number: int
    url: str
    state: Literal["open", "closed"]
    merged: bool
    merge_sha: str
    head_sha: str
    base: str
    labels: tuple[str, ...]
    closed_by: str = ""
    # Handed to the forge's own merge queue (auto-merge on): the merge comes back from there.
    handed: bool = False
    reviews: tuple[ReviewNote, ...] = ()
    checks: tuple[CheckNote, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class MergeOutcome:
    """`merged` with the forge's merge commit, or `queued`: handed to the forge's own merge
    queue (the merge comes back through the webhook or the poll)."""

    merged: bool
    sha: str = ""
    queued: bool = False


class Forge(Protocol):
    def branch_push(self, *, repo: Path, branch: str, sha: str) -> None:
        """The forge's `branch` at `sha` (forced: the branch is the quantum's own)."""

    def pull_find(self, *, branch: str) -> PullView | None:
        """The open pull request whose head is `branch`, if any (without reviews or checks)."""

    def pull_open(self, *, branch: str, base: str, title: str, body: str) -> PullView:
        """A new pull request; one already open for the branch is returned instead."""

    def pull_update(self, *, number: int, title: str, body: str, labels: list[str]) -> PullView:
        """Title, body and exactly these labels among the ones we manage."""

    def pull_view(self, *, number: int) -> PullView:
        """The pull request with its reviews (and their comments) and its head's checks."""

    def pull_merge(self, *, number: int, sha: str, method: str) -> MergeOutcome:
        """Merge the pull request if its head is still `sha`; already merged: its merge."""
