"""Web security glue: the Content-Security-Policy header (django-csp) with the page's own
websocket origin, the client's address behind trusted proxies, and the login lockout page
(django-axes)."""

from __future__ import annotations

import math
from datetime import timedelta

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, adding ws(s)://<this host> to `connect-src` for the live pages'
    socket. CSP level 3 lets 'self' match it too, but older engines compare schemes literally
    and would refuse ws: from an http: page."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()
        except DisallowedHost:
            # The 400 for a host outside ALLOWED_HOSTS still gets the policy, without this.
            return parts
        socket = f"{'wss' if request.is_secure() else 'ws'}://{host}"
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", ()), socket]
        parts.update = update
        return parts


def client_address(request: HttpRequest) -> str | None:
    """The address a request came from: REMOTE_ADDR, or behind TRUSTED_PROXIES proxies the entry
    of X-Forwarded-For the outermost of them appended (entries further left were written by the
    client and are not believed). None when the request has no address (a test client's
    websocket). Login throttling and django-axes key on it."""
    remote: str | None = request.META.get("REMOTE_ADDR") or None
    hops = int(settings.TRUSTED_PROXIES)
    if not hops or remote is None:
        return remote
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR", ""))
    chain = [part.strip() for part in forwarded.split(",") if part.strip()] + [remote]
    return chain[max(len(chain) - 1 - hops, 0)]


def login_lockout_response(
    request: HttpRequest, original_response: object = None, credentials: object = None
) -> HttpResponse:
    """django-axes' answer to a login refused for too many failures: a page saying how long the
    pause lasts, with 429 Too Many Requests (AXES_LOCKOUT_CALLABLE)."""
    cooloff: timedelta = settings.AXES_COOLOFF_TIME
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": math.ceil(cooloff.total_seconds() / 60),
    }
    return render(request, "registration/locked_out.html", context, status=429)
