"""The Tether over HTTP: questions (list, answer), drifts (ground, reject), changes (show,
approve, reject)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema

from api.auth import operate_auth, read_auth
from api.pagination import keyset_page, listing_id, offset_cursor, offset_of
from api.schemas import (
    AnswerIn,
    AnswerOut,
    ChangeDetailOut,
    ChangeOut,
    ChangePage,
    DriftOut,
    DriftPage,
    GroundIn,
    ProblemOut,
    QuestionPage,
    ReasonIn,
)
from api.selectors import changes_all, drifts_all, questions_all
from api.views.common import atomic_call, by_of, page_size
from tether.models import ChangeReview, Drift, ReachingStatus
from tether.selectors import change_detail, reachings_pending
from tether.services.changes import change_approve, change_reject
from tether.services.drifts import drift_ground, drift_reject
from tether.services.reachings import reaching_answer

router = Router(tags=["tether"])

ERRORS: dict[int | tuple[int, ...], Any] = {(400, 401, 403, 404, 409, 422, 429): ProblemOut}
# The pending queue is read whole from Redis (it is the operator's inbox, small by design).
PENDING_MAX = 1000


class ListFilters(Schema):
    status: str | None = None
    cursor: str | None = None
    limit: int | None = None


@router.get("/questions", response={200: QuestionPage, **ERRORS}, auth=read_auth)
def questions_list_view(request: HttpRequest, filters: Query[ListFilters]) -> dict[str, Any]:
    """Agents' questions. Pending (the default): in queue order, critical first, then the
    earliest deadline. Another status: newest first."""
    limit = page_size(filters.limit)
    status = filters.status or ReachingStatus.PENDING
    listing = listing_id("questions", {"status": status})
    if status != ReachingStatus.PENDING:
        page = keyset_page(
            questions_all(status=status),
            listing=listing,
            order=("-id",),
            cursor=filters.cursor,
            limit=limit,
        )
        return {"items": page.items, "next_cursor": page.next_cursor}
    offset = offset_of(filters.cursor, listing=listing)
    pending = reachings_pending(limit=PENDING_MAX)
    rows = pending[offset : offset + limit]
    more = len(pending) > offset + limit
    return {
        "items": rows,
        "next_cursor": offset_cursor(listing=listing, offset=offset + limit) if more else None,
    }


@router.post(
    "/questions/{int:reaching_id}/answer", response={200: AnswerOut, **ERRORS}, auth=operate_auth
)
def question_answer_view(
    request: HttpRequest, reaching_id: int, payload: AnswerIn
) -> dict[str, Any]:
    """Answer a question: the waiting agent resumes with it; after its deadline it is a late
    answer that grounds or supersedes the drift."""
    result = atomic_call(
        reaching_answer, reaching_id=reaching_id, text=payload.text, by=by_of(request)
    )
    return {
        "kind": result.kind,
        "reaching_id": result.reaching_id,
        "resumed": result.resumed,
        "drift_id": result.drift_id,
        "correction_id": result.correction_id,
    }


@router.get("/drifts", response={200: DriftPage, **ERRORS}, auth=read_auth)
def drifts_list_view(request: HttpRequest, filters: Query[ListFilters]) -> dict[str, Any]:
    """Drifts (assumptions agents went on with), newest first; `status=open` is the queue."""
    page = keyset_page(
        drifts_all(status=filters.status),
        listing=listing_id("drifts", {"status": filters.status}),
        order=("-id",),
        cursor=filters.cursor,
        limit=page_size(filters.limit),
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.post("/drifts/{int:drift_id}/ground", response={200: DriftOut, **ERRORS}, auth=operate_auth)
def drift_ground_view(request: HttpRequest, drift_id: int, payload: GroundIn) -> Drift:
    """Confirm the assumption."""
    return atomic_call(drift_ground, drift_id=drift_id, by=by_of(request), comment=payload.comment)


@router.post("/drifts/{int:drift_id}/reject", response={200: DriftOut, **ERRORS}, auth=operate_auth)
def drift_reject_view(request: HttpRequest, drift_id: int, payload: ReasonIn) -> Drift:
    """Reject the assumption: a correction quantum is filed with the reason."""
    return atomic_call(drift_reject, drift_id=drift_id, reason=payload.reason, by=by_of(request))


@router.get("/changes", response={200: ChangePage, **ERRORS}, auth=read_auth)
def changes_list_view(request: HttpRequest, filters: Query[ListFilters]) -> dict[str, Any]:
    """Change reviews, newest first (without diffs); `status=pending` is the review queue."""
    page = keyset_page(
        changes_all(status=filters.status),
        listing=listing_id("changes", {"status": filters.status}),
        order=("-id",),
        cursor=filters.cursor,
        limit=page_size(filters.limit),
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get("/changes/{int:change_id}", response={200: ChangeDetailOut, **ERRORS}, auth=read_auth)
def change_show(request: HttpRequest, change_id: int) -> dict[str, Any]:
    """A change review with its (redacted) diff per file."""
    detail = change_detail(change_id=change_id)
    return {"change": detail.review, "files": detail.files}


@router.post(
    "/changes/{int:change_id}/approve", response={200: ChangeOut, **ERRORS}, auth=operate_auth
)
def change_approve_view(request: HttpRequest, change_id: int) -> ChangeReview:
    """Approve into the merge queue: it merges if the checks pass on the merged result."""
    return atomic_call(change_approve, change_id=change_id, by=by_of(request))


@router.post(
    "/changes/{int:change_id}/reject", response={200: ChangeOut, **ERRORS}, auth=operate_auth
)
def change_reject_view(request: HttpRequest, change_id: int, payload: ReasonIn) -> ChangeReview:
    """Reject the change, saying why."""
    return atomic_call(change_reject, change_id=change_id, reason=payload.reason, by=by_of(request))
