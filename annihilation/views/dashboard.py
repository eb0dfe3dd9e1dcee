from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from annihilation.views.fragments import RowCache
from autopilot.views.hub import HUB_TOPICS, card_context
from bursts.forms import WaveStartForm
from bursts.selectors import Dashboard, dashboard_summary
from bursts.services import wave_start
from core.access import operator_required, user_can_operate
from core.events import EventMessage
from core.live import live_attrs, live_page
from core.models import Event
from core.redis import get_redis
from operations.selectors import operations_card
from psychonauts.containment.sandbox import sandbox_status
from psychonauts.environments.selectors import environments_failed
from psychonauts.routing.registry import registry_hosts
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


def events_recent(*, limit: int = RECENT_EVENTS) -> list[Event]:
    """The newest `limit` events of the dashboard's topics: for each topic the last `limit`
    entries of `event_topic_seq` (topic, id) up to the topic's end, those of the topic kept,
    then the newest of all (a cost that does not grow with the table).

    The read is a range on the row (topic, id), which only that index gives in order. Given
    `topic = ...` (or `topic IN (...)`) and `ORDER BY id`, the planner walked the primary key
    backwards through every other event since the topic's last (growing with the agents'
    events), and the whole table for a topic without events."""
    table = Event._meta.db_table
    return list(
        Event.objects.raw(
            f"""SELECT e.id, e.session_id, e.topic, e.type, e.payload, e.created_at
                FROM unnest(%s::text[]) AS t(topic)
                CROSS JOIN LATERAL (
                    SELECT * FROM {table}
                    WHERE ({table}.topic, {table}.id) <= (t.topic, %s)
                    ORDER BY {table}.topic DESC, {table}.id DESC LIMIT %s
                ) AS e
                WHERE e.topic = t.topic
                ORDER BY e.id DESC LIMIT %s""",
            [DASHBOARD_TOPICS, 2**63 - 1, limit, limit],
        )
    )


DASHBOARD_TOPICS = [
    "burst:events",
    "quanta",
    "tether:reaching",
    "tether:drifts",
    "alerts",
    *HUB_TOPICS,
]


# Rows rendered once per process and value (fragments.py): the live agents' table and the
# recent events are most of the page's template work.
AGENT_ROWS = RowCache("annihilation/_agent_row.html", size=2000)
EVENT_ROWS = RowCache("annihilation/_event.html", size=200)


def summary_context() -> dict[str, Any]:
    """What templates/annihilation/_summary.html needs (the page, and its live redraws)."""
    summary: Dashboard = dashboard_summary()
    rows: list[SafeString] = [
        AGENT_ROWS.render(tuple(a.values()), {"a": a}) for a in summary["live_agents"]
    ]
    return {"summary": summary, "live_rows": rows}


def event_rows(events: list[Event]) -> list[SafeString]:
    # An event is never changed: its id and time name its row.
    return [EVENT_ROWS.render((e.pk, e.created_at), {"e": e}) for e in events]


def dashboard_render(
    request: HttpRequest, *, start_form: WaveStartForm | None = None, status: int = 200
) -> HttpResponse:
    summary = summary_context()
    return render(
        request,
        "annihilation/dashboard.html",
        {
            **summary,
            "hosts": registry_hosts(),
            "tether_counts": tether_counts(),
            "event_rows": event_rows(events_recent()),
            "sandbox": sandbox_status(),
            "environment_failures": environments_failed(),
            "start_form": start_form or WaveStartForm(),
            **card_context(),
            **operations_card(depths=summary["summary"]["queues"]),
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
        return {**summary_context(), "hosts": registry_hosts()}
    if event["topic"].startswith("tether:"):
        return {"tether_counts": tether_counts()}
    if event["topic"].startswith("autopilot:"):
        return card_context()
    if event["topic"] == "alerts":
        return operations_card()
    return {}


@require_POST
@operator_required
def wave_start_view(request: HttpRequest) -> HttpResponse:
    form = WaveStartForm(request.POST)
    if not form.is_valid():
        return dashboard_render(request, start_form=form, status=400)
    repository = form.cleaned_data["repository"]
    wave = wave_start(
        repository_id=repository.pk if repository else None,
        labels=form.cleaned_data["labels"],
        continuous=form.cleaned_data["continuous"],
        started_by=request.user.get_username(),
    )
    messages.success(request, f"Wave {wave.pk} started ({wave.status}).")
    return redirect("dashboard")
