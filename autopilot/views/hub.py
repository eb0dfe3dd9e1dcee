"""The autopilot's history page (its card, transitions paged, spend per state per day, holds,
findings) and the card's actions: pause, resume, force a state. The card redraws live on the
hub's and the budgets' events (`autopilot:hub`, `autopilot:budget`), here and on the dashboard."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from autopilot.errors import AutopilotError
from autopilot.events import BUDGET_TOPIC, HUB_TOPIC
from autopilot.forms import HubForceForm, HubPauseForm
from autopilot.models import SPEND_SCOPES, Hub, HubTransition
from autopilot.selectors import (
    SPEND_DAYS,
    findings_recent,
    holds_list,
    hub_status,
    hub_transitions,
    spend_per_day,
)
from autopilot.services.hub import hub_force, hub_pause, hub_resume
from autopilot.views.common import next_url
from core.access import operator_required
from core.events import EventMessage
from core.live import live_attrs, live_page

HUB_TOPICS = [HUB_TOPIC, BUDGET_TOPIC]


def card_context() -> dict[str, Any]:
    """What templates/autopilot/_card.html needs (the dashboard includes it too)."""
    return {"autopilot": hub_status(), "force_form": HubForceForm(), "pause_form": HubPauseForm()}


def transitions_page(number: str | None) -> Page[HubTransition]:
    return Paginator(hub_transitions(), settings.UI_PAGE_SIZE).get_page(number)


def autopilot_page(request: HttpRequest) -> HttpResponse:
    page = transitions_page(request.GET.get("page"))
    return render(
        request,
        "autopilot/history.html",
        {
            **card_context(),
            "card_next": reverse("autopilot"),
            "page": page,
            "scopes": SPEND_SCOPES,
            "days": spend_per_day(days=SPEND_DAYS),
            "holds": holds_list(),
            "findings": findings_recent(),
            **live_attrs(HUB_TOPICS, "autopilot", number=page.number),
        },
    )


def _hub_action(request: HttpRequest, act: Any, done: Any) -> HttpResponse:
    back = next_url(request, reverse("dashboard"))
    try:
        hub: Hub = act()
    except AutopilotError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done(hub))
    return redirect(back)


@require_POST
@operator_required
def autopilot_pause_view(request: HttpRequest) -> HttpResponse:
    form = HubPauseForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(str(e) for e in form.errors.get("reason", [])))
        return redirect(next_url(request, reverse("dashboard")))
    reason, by = form.cleaned_data["reason"], request.user.get_username()
    return _hub_action(
        request,
        lambda: hub_pause(by=by, reason=reason),
        lambda hub: "Autopilot paused: it acts again when resumed.",
    )


@require_POST
@operator_required
def autopilot_resume_view(request: HttpRequest) -> HttpResponse:
    by = request.user.get_username()
    return _hub_action(
        request,
        lambda: hub_resume(by=by),
        lambda hub: f"Autopilot resumed ({hub.state}).",
    )


@require_POST
@operator_required
def autopilot_force_view(request: HttpRequest) -> HttpResponse:
    form = HubForceForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(str(e) for e in form.errors.get("state", [])))
        return redirect(next_url(request, reverse("dashboard")))
    state, by = form.cleaned_data["state"], request.user.get_username()
    return _hub_action(
        request,
        lambda: hub_force(state=state, by=by),
        lambda hub: f"Autopilot forced to {hub.state}: ticks keep it there until resumed.",
    )


@live_page("autopilot")
def autopilot_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    context = {**card_context(), "card_next": reverse("autopilot")}
    if params.get("number", "1") == "1":  # older pages stay as they were read
        context["page"] = transitions_page("1")
    return context
