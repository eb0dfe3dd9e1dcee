"""The Playbook and Skills pages, the playbook section of the Grounding page, and the
operator's actions on deltas and rules."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import operator_required, user_can_operate
from reflection.errors import IllegalTransition, NotFound, ReflectionError
from reflection.models import DeltaStatus, PlaybookDelta
from reflection.selection import Policy
from reflection.selectors import (
    deltas_recent,
    deltas_waiting,
    reflection_runs_recent,
    rules_by_maturity,
    skills_ranked,
)
from reflection.services.playbook import delta_decide
from reflection.services.playbook_io import rule_deprecate

REASON_MAX = 2000


def grounding_deltas_context(request: HttpRequest) -> dict[str, Any]:
    """The Grounding page's playbook section (registered in reflection.apps)."""
    return {"deltas": deltas_waiting(), "can_operate": user_can_operate(request.user)}


def playbook_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "reflection/playbook.html",
        {
            "groups": rules_by_maturity(),
            "deltas": deltas_waiting(),
            "decided": deltas_recent(limit=20),
            "runs": reflection_runs_recent(),
        },
    )


def skills_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "reflection/skills.html",
        {
            "rows": skills_ranked(policy=cast(Policy, settings.REFLECTION_SKILL_POLICY)),
            "policy": settings.REFLECTION_SKILL_POLICY,
        },
    )


def _back(request: HttpRequest, anchor: str) -> HttpResponse:
    # Back to the page the form was on (Playbook or Grounding), never to another host.
    target = (
        reverse("grounding") if request.POST.get("next") == "grounding" else reverse("playbook")
    )
    return redirect(target + anchor)


def _reason(request: HttpRequest) -> str:
    return str(request.POST.get("reason", "")).strip()[:REASON_MAX]


def _decide(request: HttpRequest, delta_id: int, to: str) -> HttpResponse:
    if not PlaybookDelta.objects.filter(pk=delta_id).exists():
        raise Http404(f"no delta #{delta_id}")
    try:
        delta = delta_decide(
            delta_id, to=to, by=request.user.get_username(), reason=_reason(request)
        )
    except (IllegalTransition, NotFound) as exc:  # decided already, or its rule is gone
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Delta #{delta.pk} {delta.get_status_display()}.")
    return _back(request, f"#delta-{delta_id}")


@require_POST
@operator_required
def delta_ground_view(request: HttpRequest, delta_id: int) -> HttpResponse:
    return _decide(request, delta_id, DeltaStatus.GROUNDED)


@require_POST
@operator_required
def delta_reject_view(request: HttpRequest, delta_id: int) -> HttpResponse:
    return _decide(request, delta_id, DeltaStatus.REJECTED)


@require_POST
@operator_required
def rule_deprecate_view(request: HttpRequest, rule_id: int) -> HttpResponse:
    try:
        rule = rule_deprecate(
            rule_id=rule_id, by=request.user.get_username(), reason=_reason(request)
        )
    except NotFound:
        raise Http404(f"no rule #{rule_id}") from None
    except ReflectionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rule #{rule.pk} deprecated.")
    return redirect(reverse("playbook") + f"#rule-{rule_id}")
