"""What every router shares: page sizes, who an action is by, creates with idempotency keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from ninja import Schema
from ninja.errors import ValidationError

from api.auth import token_of
from api.services import idempotent_run

IDEMPOTENCY_KEY_MAX = 255

T = TypeVar("T")


def atomic_call(service: Callable[..., T], /, **kwargs: Any) -> T:
    """`service(**kwargs)` in a transaction: a refusal part way writes nothing."""
    with transaction.atomic():
        return service(**kwargs)


def page_size(limit: int | None) -> int:
    """The page size asked for, the default without one; above the maximum is refused."""
    if limit is None:
        return int(settings.API_PAGE_SIZE)
    if not 1 <= limit <= settings.API_PAGE_MAX:
        raise ValidationError(
            [
                {
                    "loc": ["query", "limit"],
                    "msg": f"between 1 and {settings.API_PAGE_MAX}",
                    "type": "value_error",
                }
            ]
        )
    return limit


def by_of(request: HttpRequest) -> str:
    """Who the apps record as having done it: the token's client."""
    return f"api:{token_of(request).name}"[:150]


def idempotency_key(request: HttpRequest) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isascii() or not key.isprintable():
        raise ValidationError(
            [
                {
                    "loc": ["header", "Idempotency-Key"],
                    "msg": f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters",
                    "type": "value_error",
                }
            ]
        )
    return key


def created(
    request: HttpRequest,
    *,
    operation: str,
    payload: Schema,
    run: Callable[[], Any],
    out: Callable[[Any], dict[str, Any]],
) -> JsonResponse:
    """201 with `out(run())`, all in one transaction. With an `Idempotency-Key` the first
    response is stored with the writes and sent again for the same key and body (marked
    `Idempotent-Replayed: true`); another body with that key is a 422 and runs nothing."""
    key = idempotency_key(request)

    def once() -> tuple[int, Any]:
        return 201, out(run())

    if key is None:
        with transaction.atomic():
            status, body = once()
        return JsonResponse(body, status=status, safe=False)
    result = idempotent_run(
        token_id=token_of(request).pk,
        key=key,
        operation=operation,
        request_body=payload.model_dump_json().encode(),
        run=once,
    )
    response = JsonResponse(result.body, status=result.status_code, safe=False)
    if result.replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def dump(schema: type[Schema], obj: Any) -> dict[str, Any]:
    """`obj` (a model or a dict) as `schema`'s JSON."""
    return schema.model_validate(obj, from_attributes=True).model_dump(mode="json")
