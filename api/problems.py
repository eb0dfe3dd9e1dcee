"""Every error the API returns is an RFC 9457 problem: application/problem+json with type,
title, status, detail and instance, plus `errors` (one per field) for refused input."""

from __future__ import annotations

import json
import logging
from typing import Any, TypedDict

from django.http import HttpRequest, HttpResponse

from api.errors import BadCursor, IdempotencyConflict, InvalidToken, TokenNotFound
from autopilot.errors import GoalNotFound, IllegalGoalTransition, InvalidGoal
from bursts.errors import InvalidWave, WaveNotFound, WaveNotRunning
from core.metrics import validation_failed
from quanta.errors import (
    BadSearchQuery,
    DependencyCycle,
    DuplicateDependency,
    IllegalTransition,
    ImportFailed,
    InvalidQuantum,
    QuantumNotFound,
)
from repos.errors import InvalidRepository, RepositoryInUse, RepositoryNotFound
from tether.errors import AlreadyDecided, BranchMoved, InvalidInput, NotFound

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "urn:annihilation:problem:"


class FieldError(TypedDict):
    field: str  # dotted path into the request ("body.title", "query.limit"), or "" for the whole
    message: str


# The kinds of problem: slug (the type URI's last part) -> (status, title).
KINDS: dict[str, tuple[int, str]] = {
    "malformed": (400, "Malformed request"),
    "bad-cursor": (400, "Bad pagination cursor"),
    "unauthenticated": (401, "Authentication required"),
    "forbidden": (403, "Scope missing"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "conflict": (409, "Conflict"),
    "too-large": (413, "Request body too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "validation": (422, "Invalid input"),
    "idempotency-conflict": (422, "Idempotency key reused with another request"),
    "rate-limited": (429, "Too many requests"),
    "server-error": (500, "Internal server error"),
}

# Domain errors of the apps below, by the kind of problem they are. The first match wins.
DOMAIN_ERRORS: list[tuple[type[Exception], str]] = [
    (QuantumNotFound, "not-found"),
    (WaveNotFound, "not-found"),
    (GoalNotFound, "not-found"),
    (NotFound, "not-found"),
    (TokenNotFound, "not-found"),
    (IllegalTransition, "conflict"),
    (DependencyCycle, "conflict"),
    (DuplicateDependency, "conflict"),
    (WaveNotRunning, "conflict"),
    (IllegalGoalTransition, "conflict"),
    (AlreadyDecided, "conflict"),
    (BranchMoved, "conflict"),
    (IdempotencyConflict, "idempotency-conflict"),
    (BadCursor, "bad-cursor"),
    (ImportFailed, "validation"),
    (BadSearchQuery, "validation"),
    (InvalidQuantum, "validation"),
    (InvalidWave, "validation"),
    (InvalidGoal, "validation"),
    (InvalidInput, "validation"),
    (InvalidToken, "validation"),
    (RepositoryNotFound, "not-found"),
    (RepositoryInUse, "conflict"),
    (InvalidRepository, "validation"),
]


def problem(
    request: HttpRequest,
    kind: str,
    detail: str,
    *,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    """The problem response of `kind`. A 4xx on input (400, 413, 415, 422) is counted as a
    validation failure of the "api" entry point."""
    status, title = KINDS[kind]
    body: dict[str, Any] = {
        "type": TYPE_BASE + kind,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.path,
    }
    if errors:
        body["errors"] = errors
    if status in (400, 413, 415, 422):
        validation_failed("api")
    response = HttpResponse(json.dumps(body), status=status, content_type=CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def domain_problem(request: HttpRequest, exc: Exception) -> HttpResponse | None:
    """The problem for a domain error of the apps, or None when it is not one."""
    for cls, kind in DOMAIN_ERRORS:
        if isinstance(exc, cls):
            errors: list[FieldError] | None = None
            detail = str(exc)
            if isinstance(exc, ImportFailed):
                errors = [{"field": "body.text", "message": p} for p in exc.problems]
                detail = f"{len(exc.problems)} problem(s) in the import; nothing was imported"
            elif kind == "validation":
                name, sep, _ = detail.partition(":")
                if sep and name.strip().isidentifier():
                    errors = [{"field": f"body.{name.strip()}", "message": detail}]
            return problem(request, kind, detail, errors=errors)
    return None


def pydantic_errors(raw: list[dict[str, Any]]) -> list[FieldError]:
    """Ninja's validation errors as field errors: `loc` joined with dots."""
    return [
        {
            "field": ".".join(str(part) for part in e.get("loc", ())),
            "message": str(e.get("msg", "invalid")),
        }
        for e in raw
    ]
