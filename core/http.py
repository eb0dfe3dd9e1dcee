"""What every app's pages share for answering a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.http import Http404

from core.errors import NotFoundError

T = TypeVar("T")


def or_404(fn: Callable[..., T], **kwargs: Any) -> T:
    """`fn(**kwargs)`, with an app's not-found error (core.errors.NotFoundError) as a 404."""
    try:
        return fn(**kwargs)
    except NotFoundError as exc:
        raise Http404(str(exc)) from None
