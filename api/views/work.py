"""Goals and waves: propose and decide goals; start, follow and cancel waves."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Field, Query, Router, Schema

from api.auth import operate_auth, read_auth
from api.pagination import keyset_page, listing_id
from api.schemas import (
    GoalAbandonIn,
    GoalCreateIn,
    GoalOut,
    GoalPage,
    ProblemOut,
    WaveCancelIn,
    WaveOut,
    WavePage,
    WaveStartIn,
    WaveStatusOut,
)
from api.selectors import goals_all, waves_all
from api.views.common import atomic_call, by_of, created, dump, page_size
from autopilot.goal_selectors import goal_detail
from autopilot.models import Goal
from autopilot.services.goals.lifecycle import goal_abandon, goal_approve, goal_create
from bursts.models import Wave
from bursts.selectors import wave_get, wave_progress
from bursts.services.waves import wave_cancel, wave_start
from repos.selectors import repository_get

router = Router()

ERRORS: dict[int | tuple[int, ...], Any] = {(400, 401, 403, 404, 409, 422, 429): ProblemOut}


class ListFilters(Schema):
    status: str | None = None
    repository: str | None = Field(None, description="a repository's name: its rows only")
    cursor: str | None = None
    limit: int | None = None


def _repository_id(name: str | None) -> int | None:
    """The id of the repository named (RepositoryNotFound: a 404), None for all."""
    return repository_get(name=name).pk if name else None


def _listing_filters(filters: ListFilters) -> dict[str, Any]:
    """The filters a cursor is bound to (a repository only when one is named)."""
    named = {"repository": filters.repository} if filters.repository else {}
    return {"status": filters.status, **named}


# --- goals -------------------------------------------------------------------------------------


@router.get("/goals", response={200: GoalPage, **ERRORS}, auth=read_auth, tags=["goals"])
def goals_list_view(request: HttpRequest, filters: Query[ListFilters]) -> dict[str, Any]:
    """Goals by priority, then age."""
    page = keyset_page(
        goals_all(status=filters.status, repository_id=_repository_id(filters.repository)),
        listing=listing_id("goals", _listing_filters(filters)),
        order=("priority", "created_at", "id"),
        cursor=filters.cursor,
        limit=page_size(filters.limit),
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    "/goals/{int:goal_id}", response={200: GoalOut, **ERRORS}, auth=read_auth, tags=["goals"]
)
def goal_show(request: HttpRequest, goal_id: int) -> Goal:
    return goal_detail(goal_id=goal_id).goal


@router.post("/goals", response={201: GoalOut, **ERRORS}, auth=operate_auth, tags=["goals"])
def goal_create_view(request: HttpRequest, payload: GoalCreateIn) -> JsonResponse:
    """Propose a goal; it waits for approval. Send an `Idempotency-Key` to make retries safe."""
    return created(
        request,
        operation="goals.create",
        payload=payload,
        run=lambda: goal_create(**payload.model_dump(), by=by_of(request)),
        out=lambda g: dump(GoalOut, g),
    )


@router.post(
    "/goals/{int:goal_id}/approve",
    response={200: GoalOut, **ERRORS},
    auth=operate_auth,
    tags=["goals"],
)
def goal_approve_view(request: HttpRequest, goal_id: int) -> Goal:
    return atomic_call(goal_approve, goal_id=goal_id, by=by_of(request))


@router.post(
    "/goals/{int:goal_id}/abandon",
    response={200: GoalOut, **ERRORS},
    auth=operate_auth,
    tags=["goals"],
)
def goal_abandon_view(request: HttpRequest, goal_id: int, payload: GoalAbandonIn) -> Goal:
    return atomic_call(goal_abandon, goal_id=goal_id, by=by_of(request), reason=payload.reason)


# --- waves -------------------------------------------------------------------------------------


@router.get("/waves", response={200: WavePage, **ERRORS}, auth=read_auth, tags=["waves"])
def waves_list_view(request: HttpRequest, filters: Query[ListFilters]) -> dict[str, Any]:
    """Waves, newest first."""
    page = keyset_page(
        waves_all(status=filters.status, repository_id=_repository_id(filters.repository)),
        listing=listing_id("waves", _listing_filters(filters)),
        order=("-id",),
        cursor=filters.cursor,
        limit=page_size(filters.limit),
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    "/waves/{int:wave_id}", response={200: WaveStatusOut, **ERRORS}, auth=read_auth, tags=["waves"]
)
def wave_status_view(request: HttpRequest, wave_id: int) -> dict[str, Any]:
    """A wave with its runs and agents counted by status and its running stages."""
    wave = wave_get(wave_id=wave_id)
    progress = wave_progress(wave_id=wave_id)
    return {
        "wave": wave,
        "runs": progress["runs"],
        "agents": progress["agents"],
        "stages": progress["stages"],
    }


@router.post("/waves", response={201: WaveOut, **ERRORS}, auth=operate_auth, tags=["waves"])
def wave_start_view(request: HttpRequest, payload: WaveStartIn) -> JsonResponse:
    """Start a wave over the ready quanta (of these labels). A worker must be running for its
    agents to start. Send an `Idempotency-Key` to make retries safe."""
    return created(
        request,
        operation="waves.start",
        payload=payload,
        run=lambda: wave_start(**payload.model_dump(), started_by=by_of(request)),
        out=lambda w: dump(WaveOut, w),
    )


@router.post(
    "/waves/{int:wave_id}/cancel",
    response={200: WaveOut, **ERRORS},
    auth=operate_auth,
    tags=["waves"],
)
def wave_cancel_view(request: HttpRequest, wave_id: int, payload: WaveCancelIn) -> Wave:
    """Stop a running wave: live runs are cancelled and their quanta given back as open."""
    return atomic_call(wave_cancel, wave_id=wave_id, reason=payload.reason)
