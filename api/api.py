"""The NinjaAPI: routers, the OpenAPI schema and docs, and every error as a problem."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger, _csrf_needed

from api.auth import RateLimited, ScopeMissing, read_auth, token_of
from api.errors import ApiError
from api.problems import domain_problem, problem, pydantic_errors
from api.schemas import ProblemOut, TokenOut
from api.views import quanta, repositories, tether, work
from autopilot.errors import AutopilotError
from bursts.errors import BurstsError
from quanta.errors import QuantaError
from repos.errors import RepositoryError
from tether.errors import TetherError

logger = logging.getLogger(__name__)


class Docs(Swagger):
    """Swagger UI from ninja's own template and static files, which the settings list (ninja is
    not an installed app, so Swagger would render its CDN page, whose inline script the
    Content-Security-Policy refuses)."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            "add_csrf": _csrf_needed(api),
        }
        return render(request, self.template, context)


api = NinjaAPI(
    title="Annihilation API",
    version="1",
    description=(
        "Quanta, goals, waves and the Tether for other programs. Authenticate with "
        "`Authorization: Bearer ann_…` (manage.py tokens create). Errors are RFC 9457 problem "
        "details (application/problem+json)."
    ),
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
    docs=Docs(),
)
api.add_router("/", quanta.router)
api.add_router("/", work.router)
api.add_router("/", tether.router)
api.add_router("/", repositories.router)


@api.get("/me", response={200: TokenOut, 401: ProblemOut, 429: ProblemOut}, auth=read_auth)
def me(request: HttpRequest) -> Any:
    """The token the request is made with (its name and scopes)."""
    return token_of(request)


@api.exception_handler(ValidationError)
def on_validation(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return problem(
        request,
        "validation",
        "the request has invalid fields",
        errors=pydantic_errors(list(exc.errors)),
    )


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return problem(
        request,
        "unauthenticated",
        "send `Authorization: Bearer <token>` with an active API token",
        headers={"WWW-Authenticate": 'Bearer realm="annihilation"'},
    )


@api.exception_handler(ScopeMissing)
def on_scope(request: HttpRequest, exc: ScopeMissing) -> HttpResponse:
    return problem(request, "forbidden", str(exc))


@api.exception_handler(RateLimited)
def on_rate_limited(request: HttpRequest, exc: RateLimited) -> HttpResponse:
    return problem(
        request,
        "rate-limited",
        str(exc),
        headers={"Retry-After": exc.decision.retry_after_header},
    )


@api.exception_handler(Http404)
def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return problem(request, "not-found", str(exc) or "no such resource")


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    kinds = {400: "malformed", 413: "too-large", 415: "unsupported-media-type"}
    return problem(request, kinds.get(exc.status_code, "malformed"), str(exc))


def on_domain_error(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
    if not isinstance(exc, Exception):
        exc = exc()
    response = domain_problem(request, exc)
    if response is not None:
        return response
    logger.exception("API: unexpected %s", type(exc).__name__)
    return problem(request, "server-error", "the server failed; the error is logged")


for base in (
    QuantaError,
    BurstsError,
    TetherError,
    AutopilotError,
    RepositoryError,
    ApiError,
    Exception,
):
    api.add_exception_handler(base, on_domain_error)
