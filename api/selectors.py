"""Reads the API pages through: each app's listing as a queryset in the API's stable order
(the apps' own selectors return sliced pages, which a cursor cannot continue)."""

from __future__ import annotations

from django.db.models import QuerySet

from api.models import ApiToken
from autopilot.models import Goal
from bursts.models import Wave
from tether.models import ChangeReview, Drift, Reaching


def goals_all(*, status: str | None = None, repository_id: int | None = None) -> QuerySet[Goal]:
    """Goals (paged by priority, created_at, id; the pk breaks ties), of one repository or all."""
    qs = Goal.objects.all()
    if repository_id is not None:
        qs = qs.filter(repository_id=repository_id)
    return qs.filter(status=status) if status else qs


def waves_all(*, status: str | None = None, repository_id: int | None = None) -> QuerySet[Wave]:
    """Waves (paged newest first by id), of one repository or all."""
    qs = Wave.objects.all()
    if repository_id is not None:
        qs = qs.filter(repository_id=repository_id)
    return qs.filter(status=status) if status else qs


def questions_all(*, status: str) -> QuerySet[Reaching]:
    """Questions of one status other than pending (paged newest first by id); the pending ones
    come in queue order from tether.selectors.reachings_pending."""
    return Reaching.objects.filter(status=status)


def drifts_all(*, status: str | None = None) -> QuerySet[Drift]:
    """Drifts (paged newest first by id)."""
    qs = Drift.objects.all()
    return qs.filter(status=status) if status else qs


def changes_all(*, status: str | None = None) -> QuerySet[ChangeReview]:
    """Change reviews without their diffs (paged newest first by id)."""
    qs = ChangeReview.objects.defer("diff")
    return qs.filter(status=status) if status else qs


def tokens_list(*, include_revoked: bool = False) -> QuerySet[ApiToken]:
    """Tokens in creation order; the revoked ones only when asked."""
    qs = ApiToken.objects.order_by("id")
    return qs if include_revoked else qs.filter(revoked_at__isnull=True)
