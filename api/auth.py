"""Bearer-token authentication, scopes and the per-token, per-action rate limit."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import HttpBearer

from api.models import ApiToken, TokenScope
from api.services import token_authenticate
from core.ratelimit import Decision, Rate, rate_take

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ScopeMissing(Exception):
    """The token is valid but lacks the scope the operation needs."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(f"this operation needs a token with the {scope!r} scope")


class RateLimited(Exception):
    """The token spent its bucket for this action; `decision` says how long to wait."""

    def __init__(self, decision: Decision, action: str) -> None:
        self.decision = decision
        super().__init__(
            f"too many {action} requests with this token; retry in {decision.retry_after_header} s"
        )


def action_of(request: HttpRequest) -> str:
    """The action a request is counted under: its method and route (ids left out)."""
    match = request.resolver_match
    route = match.route if match is not None else request.path
    return f"{request.method} {route}"


def rate_check(request: HttpRequest, token: ApiToken) -> None:
    """Take one request from the token's bucket for this action; RateLimited when empty."""
    per_min = (
        settings.API_READS_PER_MIN
        if request.method in READ_METHODS
        else settings.API_WRITES_PER_MIN
    )
    action = action_of(request)
    decision = rate_take(key=f"api:{token.pk}:{action}", rate=Rate(capacity=per_min, period_s=60))
    if not decision.allowed:
        raise RateLimited(decision, action)


class TokenAuth(HttpBearer):
    """`Authorization: Bearer ann_…` with the scope `scope`. An unknown, malformed or revoked
    token is None (401); a valid one without the scope raises ScopeMissing (403); then the rate
    limit (429)."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = token_authenticate(token)
        if found is None:
            return None
        if self.scope not in found.scopes:
            raise ScopeMissing(self.scope)
        rate_check(request, found)
        return found


read_auth = TokenAuth(TokenScope.READ.value)
operate_auth = TokenAuth(TokenScope.OPERATE.value)


def token_of(request: HttpRequest) -> ApiToken:
    """The token the request was authenticated with (set by TokenAuth)."""
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    return token
