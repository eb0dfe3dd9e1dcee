"""/api/: the NinjaAPI, and a problem for every path and method it does not serve."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path

from api.api import api
from api.problems import CONTENT_TYPE, problem

View = Callable[..., HttpResponse]


def problems_only(view: View) -> View:
    """A body over the size limit is refused before it is read (413). Ninja answers a path it
    has no operation for (its root) with Http404 and a method it has no operation for with a
    bare 405: problems instead.
    The API authenticates by token, not by the web session: the login redirect is not for it."""

    @login_not_required
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.API_BODY_MAX_BYTES:
            return problem(
                request,
                "too-large",
                f"the body is {int(length):,} bytes; at most {settings.API_BODY_MAX_BYTES:,}",
            )
        try:
            response = view(request, *args, **kwargs)
        except Http404:
            return not_found(request, request.path)
        if response.status_code == 405 and response.get("Content-Type") != CONTENT_TYPE:
            allowed = response.get("Allow", "")
            fixed = problem(
                request, "method-not-allowed", f"{request.method} is not served here ({allowed})"
            )
            fixed["Allow"] = allowed
            return fixed
        return response

    return wrapped


@login_not_required
def not_found(request: HttpRequest, rest: str) -> HttpResponse:
    return problem(request, "not-found", f"no API resource at {request.path}")


def _wrap(patterns: list[URLPattern | URLResolver]) -> list[URLPattern | URLResolver]:
    for p in patterns:
        if isinstance(p, URLPattern):
            p.callback = problems_only(p.callback)
    return patterns


ninja_patterns, _, namespace = api.urls
app_name = namespace  # "api": the docs page reverses api:openapi-json
urlpatterns = [*_wrap(list(ninja_patterns)), path("<path:rest>", not_found)]
