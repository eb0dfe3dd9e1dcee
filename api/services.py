"""Writes of the api app: tokens (created, used, revoked) and idempotent responses."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from api.errors import IdempotencyConflict, InvalidToken, TokenAlreadyRevoked, TokenNotFound
from api.models import ApiToken, IdempotentResponse, TokenScope

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "ann_"
NAME_MAX = ApiToken._meta.get_field("name").max_length or 100
# last_used_at is written at most this often per token: a read-heavy client would otherwise
# make every GET an UPDATE.
TOUCH_EVERY = timedelta(seconds=60)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CreatedToken:
    token: ApiToken
    secret: str  # the whole bearer token; shown once, never stored


def _clean_scopes(scopes: Iterable[str]) -> list[str]:
    cleaned = sorted({s.strip() for s in scopes})
    if not cleaned:
        raise InvalidToken(f"scopes: give at least one of {', '.join(TokenScope.values)}")
    unknown = [s for s in cleaned if s not in TokenScope.values]
    if unknown:
        raise InvalidToken(
            f"scopes: unknown {', '.join(map(repr, unknown))} "
            f"(one of {', '.join(TokenScope.values)})"
        )
    return cleaned


def clean_token_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise InvalidToken("name: say which client the token is for")
    if len(name) > NAME_MAX:
        raise InvalidToken(f"name: at most {NAME_MAX} characters")
    if any(ord(c) < 32 for c in name):
        raise InvalidToken("name: no control characters")
    return name


@transaction.atomic
def token_create(*, name: str, scopes: Iterable[str], by: str = "") -> CreatedToken:
    """A new token; `secret` is the only time the whole token exists outside the client."""
    fields = {"name": clean_token_name(name), "scopes": _clean_scopes(scopes)}
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        prefix=prefix, secret_sha256=sha256_hex(secret), created_by=by[:150], **fields
    )
    logger.info(
        "API token %s created", token.pk, extra={"token_id": token.pk, "scopes": token.scopes}
    )
    return CreatedToken(token=token, secret=secret)


@transaction.atomic
def token_revoke(*, token_id: int, by: str = "") -> ApiToken:
    """active -> revoked. Revoking twice is an error and changes nothing."""
    updated = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=by[:150]
    )
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None:
        raise TokenNotFound(f"no API token #{token_id}")
    if updated != 1:
        raise TokenAlreadyRevoked(f"API token #{token_id} is already revoked")
    logger.info("API token %s revoked", token.pk, extra={"token_id": token.pk})
    return token


def token_authenticate(secret: str) -> ApiToken | None:
    """The active token whose secret this is, or None. The row is found by its prefix and the
    hash compared in constant time; last use is recorded at most once a minute."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    prefix, sep, _ = secret[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not prefix:
        return None
    token = ApiToken.objects.filter(prefix=prefix).first()
    if token is None:
        # Compare anyway, so an unknown prefix costs what a wrong secret costs.
        hmac.compare_digest(sha256_hex(secret), "0" * 64)
        return None
    if not hmac.compare_digest(sha256_hex(secret), token.secret_sha256):
        return None
    if token.revoked_at is not None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(last_used_at=now)
        token.last_used_at = now
    return token


# --- idempotency -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayable:
    status_code: int
    body: Any
    replayed: bool  # True: the stored first response, the operation did not run again


def idempotent_run(
    *,
    token_id: int,
    key: str,
    operation: str,
    request_body: bytes,
    run: Callable[[], tuple[int, Any]],
) -> Replayable:
    """Run `run` once per (token, key): its response is stored in the same transaction as its
    writes, so a failure stores nothing and the key can be sent again. A transaction-scoped
    advisory lock on the key makes a concurrent second request wait for the first and then
    replay it. The same key with another body or operation raises IdempotencyConflict."""
    request_sha = hashlib.sha256(operation.encode() + b"\n" + request_body).hexdigest()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"{token_id}:{key}"]
            )
        retention = timedelta(hours=settings.API_IDEMPOTENCY_RETENTION_H)
        stored = IdempotentResponse.objects.filter(token_id=token_id, key=key).first()
        if stored is not None and stored.created_at < timezone.now() - retention:
            IdempotentResponse.objects.filter(pk=stored.pk).delete()
            stored = None
        if stored is not None:
            if stored.request_sha256 != request_sha:
                raise IdempotencyConflict(
                    f"Idempotency-Key {key!r} was used with another request"
                    f" ({stored.operation}); use a new key for a new request"
                )
            return Replayable(stored.status_code, stored.body, replayed=True)
        status_code, body = run()
        IdempotentResponse.objects.create(
            token_id=token_id,
            key=key,
            operation=operation,
            request_sha256=request_sha,
            status_code=status_code,
            body=body,
        )
        return Replayable(status_code, body, replayed=False)


def idempotency_purge() -> int:
    """Forget responses older than the retention; returns how many."""
    cutoff = timezone.now() - timedelta(hours=settings.API_IDEMPOTENCY_RETENTION_H)
    deleted, _ = IdempotentResponse.objects.filter(created_at__lt=cutoff).delete()
    return deleted
