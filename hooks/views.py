"""The GitHub endpoint: thin over hooks.services.github; refusals as RFC 9457 problem details."""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from core.metrics import validation_failed
from hooks.errors import WebhookRefused
from hooks.services.github import Received, github_receive


def problem(status: int, title: str, detail: str, instance: str = "") -> HttpResponse:
    """An RFC 9457 problem-details response."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    return HttpResponse(json.dumps(body), status=status, content_type="application/problem+json")


def _body(request: HttpRequest, limit: int) -> bytes:
    """The body, read no further than one byte past the limit (a larger one is refused without
    being held in memory)."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return b"\0" * (limit + 1)  # refused by its declared size; the rest is never read
    return request.read(limit + 1)


def _receive(**delivery: Any) -> Received:
    """The service, in a thread of the executor: its connection goes back to the pool after."""
    try:
        return github_receive(**delivery)
    finally:
        connections.close_all()


@csrf_exempt
@login_not_required
@require_POST
async def github(request: HttpRequest) -> HttpResponse:
    """Asynchronous, with the service in the executor's threads: deliveries are taken in
    parallel (each waits mostly on its commit), not one at a time on the one thread that runs
    synchronous views."""
    try:
        received = await sync_to_async(_receive, thread_sensitive=False)(
            body=_body(request, settings.HOOKS_GITHUB_MAX_BYTES),
            signature=request.headers.get("X-Hub-Signature-256", ""),
            event=request.headers.get("X-GitHub-Event", ""),
            delivery_id=request.headers.get("X-GitHub-Delivery", ""),
        )
    except WebhookRefused as refused:
        validation_failed("webhook")
        return problem(refused.status, refused.title, refused.detail, request.path)
    return JsonResponse(
        {"delivery": received.delivery_id, "event": received.event, "outcome": received.outcome,
         "quantum_id": received.quantum_id},
        status=202,
    )  # fmt: skip
