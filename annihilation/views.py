from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from annihilation.access import user_can_operate
from annihilation.events import EventMessage
from annihilation.live import events_last_id, live_page
from annihilation.models import Event
from annihilation.redis import get_redis
from bursts.forms import WaveStartForm
from bursts.selectors import dashboard_summary
from psychonauts.sandbox import sandbox_status
from tether.selectors import tether_counts

RECENT_EVENTS = 20


@login_not_required
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for the web process: can it reach Postgres and Redis?"""
    status: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        status["postgres"] = "ok"
    except Exception as exc:
        status["postgres"] = f"error: {exc.__class__.__name__}"
    try:
        get_redis().ping()
        status["redis"] = "ok"
    except Exception as exc:
        status["redis"] = f"error: {exc.__class__.__name__}"
    healthy = all(v == "ok" for v in status.values())
    return JsonResponse(status, status=200 if healthy else 503)


def ui_context(request: HttpRequest) -> dict[str, Any]:
    """Every page: may this user act, and where Flower is."""
    return {
        "can_operate": user_can_operate(getattr(request, "user", None)),
        "flower_url": settings.FLOWER_URL,
    }


def live_attrs(topics: list[str], page: str, **params: Any) -> dict[str, Any]:
    """What base.html puts on <body> for static/live.js: topics, page, params, catch-up point."""
    return {
        "live_topics": topics,
        "live_topics_json": json.dumps(topics),
        "live_page": page,
        "live_params_json": json.dumps({k: str(v) for k, v in params.items()}),
        "live_after": events_last_id(),
    }


def events_recent(*, limit: int = RECENT_EVENTS) -> list[Event]:
    return list(
        Event.objects.filter(topic__in=DASHBOARD_TOPICS).defer("search").order_by("-id")[:limit]
    )


DASHBOARD_TOPICS = ["burst:events", "quanta", "tether:reaching", "tether:drifts"]


def dashboard_render(
    request: HttpRequest, *, start_form: WaveStartForm | None = None, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "annihilation/dashboard.html",
        {
            "summary": dashboard_summary(),
            "tether_counts": tether_counts(),
            "events": events_recent(),
            "sandbox": sandbox_status(),
            "start_form": start_form or WaveStartForm(),
            **live_attrs(DASHBOARD_TOPICS, "dashboard"),
        },
        status=status,
    )


def dashboard(request: HttpRequest) -> HttpResponse:
    return dashboard_render(request)


@live_page("dashboard")
def dashboard_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    # Counters are re-read, not patched from the payload: they stay right even if an event
    # was dropped, and one grouped query per block is cheap.
    if event["topic"] == "burst:events":
        return {"summary": dashboard_summary()}
    if event["topic"].startswith("tether:"):
        return {"tether_counts": tether_counts()}
    return {}
