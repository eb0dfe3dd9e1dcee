"""API tokens (one per client program) and the responses kept for idempotency keys."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class TokenScope(models.TextChoices):
    """What a token may do: `read` lists and shows; `operate` also creates and decides."""

    READ = "read", "read: list, search and show"
    OPERATE = "operate", "operate: create, update, start, cancel, answer, decide"


class ApiToken(models.Model):
    """A client's bearer token, `ann_<prefix>_<secret>`. Only the prefix (to find the row) and
    the SHA-256 of the whole token are stored; the token itself is shown once, on creation.

    Transitions: active (revoked_at null) -> revoked (compare-and-set in api.services.tokens);
    revoked is terminal.
    """

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_sha256 = models.CharField(max_length=64, editable=False)
    scopes = ArrayField(models.CharField(max_length=16, choices=TokenScope.choices))
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)

    class Meta:
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="api_token_name_not_empty"),
            models.CheckConstraint(
                condition=Q(scopes__contained_by=TokenScope.values) & ~Q(scopes=[]),
                name="api_token_scopes_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (ann_{self.prefix}_…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class IdempotentResponse(models.Model):
    """The first response to a create sent with an `Idempotency-Key`: the same key and body get
    it again, the same key with another body is refused."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    operation = models.CharField(max_length=100)
    request_sha256 = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # The lookup of every create with a key; a key belongs to one token.
            models.UniqueConstraint(fields=["token", "key"], name="api_idempotency_token_key"),
        ]
        indexes = [
            # idempotency_purge(): rows older than the retention, oldest first.
            models.Index(fields=["created_at"], name="api_idempotency_created"),
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.key!r} -> {self.status_code}"
