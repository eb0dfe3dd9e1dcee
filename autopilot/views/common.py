"""What the autopilot's pages share: where an action returns to, and a missing goal as a 404."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.http import Http404, HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme

from autopilot.errors import GoalNotFound

T = TypeVar("T")


def next_url(request: HttpRequest, default: str) -> str:
    """The page an action came from (a path on this site), else `default`."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def or_404(fn: Callable[..., T], **kwargs: Any) -> T:
    try:
        return fn(**kwargs)
    except GoalNotFound as exc:
        raise Http404(str(exc)) from None
