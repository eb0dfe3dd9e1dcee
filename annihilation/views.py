from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse

from annihilation.redis import get_redis


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
