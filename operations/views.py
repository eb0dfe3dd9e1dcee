"""/metrics for Prometheus, and the Metrics page (charts of the last hour, the alerts)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core import metrics
from operations import selectors


def _problem(status: int, title: str, detail: str) -> JsonResponse:
    """An RFC 9457 problem details response."""
    response = JsonResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status=status,
        content_type="application/problem+json",
    )
    return response


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return True
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)


@login_not_required
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Every process's metrics and the state gauges, in the Prometheus text format."""
    if not _authorized(request):
        response = _problem(
            401,
            "Unauthorized",
            "/metrics wants `Authorization: Bearer <ANNIHILATION_METRICS_TOKEN>`",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body = metrics.exposition([selectors.StateCollector()])
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)


@require_GET
def metrics_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "operations/metrics.html",
        {
            "charts": selectors.charts_last_hour(),
            "chart_width": selectors.CHART_WIDTH,
            "chart_height": selectors.CHART_HEIGHT,
            "alerts": selectors.alerts_all(),
            "history": selectors.alert_history(),
            "rules": selectors.rule_rows(),
        },
    )
