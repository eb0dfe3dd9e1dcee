"""The Playbook and Skills pages, the sections reflection adds to the Grounding, wave and
Focus pages, and the operator's actions on deltas and rules."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from bursts.models import AgentRun
from core.access import operator_required, user_can_operate
from reflection.errors import IllegalTransition, NotFound, ReflectionError
from reflection.models import DeltaStatus, PlaybookDelta
from reflection.selection import Policy
from reflection.selectors import (
    RUN_COUNT_COLUMNS,
    ConfidenceSeries,
    agent_run_rule_uses,
    agent_run_skill_use,
    deltas_recent,
    deltas_waiting,
    reflection_runs_recent,
    rules_by_maturity,
    rules_confidence_series,
    skills_ranked,
    wave_reflection_runs,
)
from reflection.services.playbook import delta_decide
from reflection.services.playbook_io import rule_deprecate

REASON_MAX = 2000
# The confidence sparkline: width and height in pixels; confidence 0..1 spans the height.
SPARK_W, SPARK_H = 120, 24


def grounding_deltas_context(request: HttpRequest) -> dict[str, Any]:
    """The Grounding page's playbook section (registered in reflection/hooks.py)."""
    return {"deltas": deltas_waiting(), "can_operate": user_can_operate(request.user)}


def wave_reflection_context(wave_id: int) -> dict[str, Any]:
    """The wave page's reflection section (registered in reflection/hooks.py), drawn again live
    on every `reflection:<status>` event of the wave."""
    return {
        "wave_id": wave_id,
        "rows": wave_reflection_runs(wave_id=wave_id),
        "count_columns": RUN_COUNT_COLUMNS,
    }


def focus_playbook_context(run: AgentRun) -> dict[str, Any]:
    """The Focus page's playbook section (registered in reflection/hooks.py): the rules injected
    into the run's prompt and the skill chosen for it."""
    return {
        "rule_uses": agent_run_rule_uses(agent_run_id=run.pk),
        "skill_use": agent_run_skill_use(agent_run_id=run.pk),
    }


def sparkline(series: ConfidenceSeries) -> dict[str, Any]:
    """A confidence series as an SVG polyline (presentation only: the values come from the
    selector): time on x from the first point to the last, confidence 0..1 on y."""
    start, end = series[0][0], series[-1][0]
    span = (end - start).total_seconds() or 1.0

    def x(at: datetime) -> float:
        return round((at - start).total_seconds() / span * SPARK_W, 2)

    def y(confidence: float) -> float:
        return round(SPARK_H - confidence * SPARK_H, 2)

    first, last = series[0][1], series[-1][1]
    return {
        "w": SPARK_W,
        "h": SPARK_H,
        "points": " ".join(f"{x(at)},{y(c)}" for at, c in series),
        "end_x": x(end),
        "end_y": y(last),
        "title": f"confidence {first:.2f} on {start:%Y-%m-%d}, {last:.2f} now",
    }


def playbook_page(request: HttpRequest) -> HttpResponse:
    groups = rules_by_maturity()
    series = rules_confidence_series([r for _, rules in groups for r in rules], now=timezone.now())
    return render(
        request,
        "reflection/playbook.html",
        {
            "groups": [
                (maturity, [(r, sparkline(series[r.pk])) for r in rules])
                for maturity, rules in groups
            ],
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
