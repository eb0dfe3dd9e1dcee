"""Webhooks: the endpoints deliveries go to, each delivery's log, the outbox's cursor over the
event stream, and the GitHub deliveries received (with what they filed)."""

from __future__ import annotations

import re

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q

from quanta.models import Quantum


class HookEvent(models.TextChoices):
    """The events an endpoint may subscribe to (hooks.events maps the event stream onto them):
    `<subject>.<what happened>`, in the past tense."""

    WAVE_COMPLETED = "wave.completed", "wave completed"
    REACHING_CREATED = "reaching.created", "reaching created"
    CHANGE_SUBMITTED = "change.submitted", "change submitted"
    ALERT_FIRED = "alert.fired", "alert fired"


# An environment variable's name: the secret itself never enters the database.
SECRET_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


def validate_secret_env(value: str) -> None:
    if not SECRET_ENV_NAME.match(value):
        raise ValidationError(
            "the NAME of an environment variable (capitals, digits and _), not the secret itself"
        )


def validate_events(value: list[str]) -> None:
    unknown = sorted(set(value) - set(HookEvent.values))
    if unknown:
        raise ValidationError(f"unknown events {unknown}; known: {HookEvent.values}")
    if not value:
        raise ValidationError("choose at least one event")


class WebhookEndpoint(models.Model):
    """A URL that receives signed POSTs for the events it chose.

    The signing secret is read from the environment variable `secret_env` when a delivery is
    sent: HMAC needs the secret itself, so a hash at rest could not sign, and an encrypted column
    would need a key from the environment anyway. The database (and its backups and dumps) never
    holds it, and rotating it is a restart.
    """

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=2000, validators=[URLValidator(schemes=["http", "https"])])
    secret_env = models.CharField(
        max_length=128,
        validators=[validate_secret_env],
        help_text="name of the environment variable that holds the signing secret",
    )
    events = ArrayField(
        models.CharField(max_length=32, choices=HookEvent.choices),
        validators=[validate_events],
        help_text=f"any of: {', '.join(HookEvent.values)}",
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    """pending -> sending -> delivered | retrying | failed; retrying -> sending.

    `sending` is held by one task at a time (compare-and-set on status and attempts); one whose
    worker died is sent again by the outbox's sweep once its next try is due.
    """

    PENDING = "pending", "pending"
    SENDING = "sending", "sending"
    RETRYING = "retrying", "retrying"
    DELIVERED = "delivered", "delivered"
    FAILED = "failed", "failed"


DELIVERY_TERMINAL: frozenset[str] = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.FAILED})


class WebhookDelivery(models.Model):
    """One event sent to one endpoint: its body (fixed at creation, so every attempt signs the
    same bytes), attempts, the last response and when it is tried next."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.BigIntegerField(help_text="core Event id")
    event = models.CharField(max_length=32, choices=HookEvent.choices)
    delivery_id = models.UUIDField(unique=True)
    body = models.TextField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    next_try_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            # Each event once per endpoint, however often the outbox reads it.
            models.UniqueConstraint(fields=["endpoint", "event_id"], name="delivery_once"),
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"
            ),
        ]
        indexes = [
            # deliveries_due(): the sweep's unfinished deliveries whose next try has come.
            models.Index(
                fields=["next_try_at"],
                condition=Q(status__in=["pending", "sending", "retrying"]),
                name="delivery_due",
            ),
            # The admin's log, newest first.
            models.Index(fields=["-created_at"], name="delivery_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.event} #{self.event_id} -> {self.endpoint_id}"


class OutboxCursor(models.Model):
    """How far the outbox has read the event stream: every event up to `last_event_id` has its
    deliveries (events after it may have some already; re-reading them adds none)."""

    name = models.CharField(max_length=32, unique=True)
    last_event_id = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_event_id}"


class GithubDelivery(models.Model):
    """A GitHub delivery received and verified: its id refuses a replay (unique), and what it did."""

    delivery_id = models.CharField(max_length=100, unique=True)
    event = models.CharField(max_length=50)
    action = models.CharField(max_length=50, blank=True)
    outcome = models.CharField(max_length=300)
    quantum = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "GitHub deliveries"
        indexes = [
            # The admin's log, newest first; github_deliveries_prune() by age.
            models.Index(fields=["received_at"], name="github_delivery_received"),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.delivery_id}"


class GithubLink(models.Model):
    """The quantum filed for a GitHub subject (`issue:<repo>#<n>`, `ci:<repo>:<workflow>`): an
    issue becomes one quantum ever; a failing workflow one open healing quantum at a time."""

    key = models.CharField(max_length=300, unique=True)
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.key} -> #{self.quantum_id}"
