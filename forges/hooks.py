"""Where the forges app plugs into the tether (core.hooks), and nowhere else: imported by
`ForgesConfig.ready()`."""

from __future__ import annotations

from forges.errors import ForgeUnavailable
from forges.services import pull_request_mark, pull_request_merge
from tether.errors import TetherError
from tether.models import ChangeReview
from tether.services.changes import ON_REVIEW_CREATED
from tether.services.merge_queue import FORGE_MERGERS, ForgeDeclined


def on_review_created(review: ChangeReview) -> bool:
    """tether.services.changes.ON_REVIEW_CREATED: a forge repository's review becomes (or
    updates) its branch's pull request, and the forge's reviewers decide it (True: no local
    auto-merge)."""
    return pull_request_mark(review) is not None


def forge_merge(review: ChangeReview) -> str | None:
    """tether.services.merge_queue.FORGE_MERGERS: the verified change merged through its pull
    request (the forge's merge sha), None for a repository that merges locally."""
    try:
        merged = pull_request_merge(change_id=review.pk)
    except ForgeUnavailable as exc:
        raise TetherError(f"the forge is unavailable: {exc}") from None
    if merged is None:
        return None
    if merged.reason:
        raise ForgeDeclined(merged.reason)
    return merged.sha


ON_REVIEW_CREATED.register(on_review_created)
FORGE_MERGERS.register(forge_merge)
