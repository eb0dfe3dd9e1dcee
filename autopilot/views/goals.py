"""The Goals page (goals by status with their progress and spend, a form to propose one, approve
and abandon) and a goal's page (its history, its quanta, its planner runs, its verification).

Reads come from autopilot.selectors; each action is one service call whose refusals become a
message (stale: nothing changed) or a form error (bad input). Both pages redraw live when a goal
changes (`autopilot:goals` events), a goal's page also when one of its quanta does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from autopilot.errors import AutopilotError, GoalNotFound, InvalidGoal
from autopilot.events import GOALS_TOPIC as GOAL_TOPIC
from autopilot.forms import GoalAbandonForm, GoalCreateForm, GoalFilterForm
from autopilot.models import GOAL_OPEN, GoalStatus
from autopilot.selectors import goal_counts, goal_page, goals_list, quantum_in_a_goal
from autopilot.services.goals.lifecycle import goal_abandon, goal_approve, goal_create
from autopilot.views.common import next_url
from core.access import operator_required
from core.events import EventMessage
from core.forms import service_error_to_form
from core.http import or_404
from core.live import LivePageError, live_attrs, live_page

GOAL_TOPICS = [GOAL_TOPIC]
# A goal that may still be approved (proposed, or failed: approved again, decomposed anew) or
# abandoned (anything not over).
APPROVABLE = frozenset({GoalStatus.PROPOSED, GoalStatus.FAILED})
ABANDONABLE = frozenset({GoalStatus.PROPOSED, GoalStatus.FAILED, *GOAL_OPEN})


def _list_context(status: str) -> dict[str, Any]:
    return {
        "rows": goals_list(status=status or None),
        "counts": goal_counts(),
        "status": status,
        "approvable": APPROVABLE,
        "abandonable": ABANDONABLE,
    }


def goals_render(
    request: HttpRequest, *, form: GoalCreateForm | None = None, status: int = 200
) -> HttpResponse:
    filter_form = GoalFilterForm(request.GET or None)
    chosen = filter_form.cleaned_data["status"] if filter_form.is_valid() else ""
    return render(
        request,
        "autopilot/goals.html",
        {
            **_list_context(chosen),
            "filter_form": filter_form,
            "form": form or GoalCreateForm(),
            # Quanta events too: a goal's progress moves when one of its quanta closes.
            **live_attrs([*GOAL_TOPICS, "quanta"], "goals", status=chosen),
        },
        status=status,
    )


def goals_page(request: HttpRequest) -> HttpResponse:
    return goals_render(request)


@require_POST
@operator_required
def goal_create_view(request: HttpRequest) -> HttpResponse:
    form = GoalCreateForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            goal = goal_create(
                title=data["title"],
                success_criteria=data["success_criteria"],
                description=data["description"],
                verify_commands=data["verify_commands"],
                priority=data["priority"],
                labels=data["labels"],
                budget_usd=data["budget_usd"],
                by=request.user.get_username(),
            )
        except InvalidGoal as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(
                request, f"Goal #{goal.pk} proposed: approve it to let the autopilot plan it."
            )
            return redirect("goal", goal_id=goal.pk)
    return goals_render(request, form=form, status=400)


def goal_view(request: HttpRequest, goal_id: int) -> HttpResponse:
    detail = or_404(goal_page, goal_id=goal_id)
    return render(
        request,
        "autopilot/goal.html",
        {
            "d": detail,
            "abandon_form": GoalAbandonForm(),
            "approvable": APPROVABLE,
            "abandonable": ABANDONABLE,
            **live_attrs([*GOAL_TOPICS, "quanta"], "goal", goal_id=goal_id),
        },
    )


@require_POST
@operator_required
def goal_approve_view(request: HttpRequest, goal_id: int) -> HttpResponse:
    back = next_url(request, reverse("goal", kwargs={"goal_id": goal_id}))
    try:
        goal = or_404(goal_approve, goal_id=goal_id, by=request.user.get_username())
    except AutopilotError as exc:  # decided already: approved, abandoned, done
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Goal #{goal.pk} approved: the autopilot plans it when it is executing."
        )
    return redirect(back)


@require_POST
@operator_required
def goal_abandon_view(request: HttpRequest, goal_id: int) -> HttpResponse:
    back = next_url(request, reverse("goal", kwargs={"goal_id": goal_id}))
    form = GoalAbandonForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(str(e) for e in form.errors.get("reason", [])))
        return redirect(back)
    try:
        goal = or_404(
            goal_abandon,
            goal_id=goal_id,
            by=request.user.get_username(),
            reason=form.cleaned_data["reason"],
        )
    except AutopilotError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Goal #{goal.pk} abandoned.")
    return redirect(back)


@live_page("goals")
def goals_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    # Re-read, not patched from the payload: counts and order stay right even if an event was
    # dropped.
    if event["topic"] == "quanta":
        quantum_id = event["payload"].get("quantum_id")
        if not isinstance(quantum_id, int) or not quantum_in_a_goal(quantum_id=quantum_id):
            raise LivePageError("not a goal's quantum")
    status = params.get("status", "")
    return _list_context(status if status in GoalStatus.values else "")


@live_page("goal")
def goal_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    try:
        goal_id = int(params["goal_id"])
        detail = goal_page(goal_id=goal_id)
    except (KeyError, ValueError, GoalNotFound):
        raise LivePageError("no such goal") from None
    payload = event["payload"]
    if event["topic"] == "quanta":
        mine = {c.quantum_id for c in detail.children} | {detail.goal.epic_id}
        if payload.get("quantum_id") not in mine:
            raise LivePageError("another goal's quantum")
    elif payload.get("goal_id") != goal_id:
        raise LivePageError("another goal's event")
    return {
        "d": detail,
        "approvable": APPROVABLE,
        "abandonable": ABANDONABLE,
        "abandon_form": GoalAbandonForm(),
    }
