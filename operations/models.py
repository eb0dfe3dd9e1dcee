"""The alerter's state: one row per alert rule that ever fired, its transitions, and the last
hour of samples the Metrics page charts. Written by `operations.services` only."""

from __future__ import annotations

from django.db import models


class AlertStatus(models.TextChoices):
    """firing -> resolved (the figure dropped below the threshold) -> firing (it reached the
    threshold again and the rule's cooldown since its last firing has passed). A rule has no
    row until it first fires; every transition is a compare-and-set in the services."""

    FIRING = "firing", "firing"
    RESOLVED = "resolved", "resolved"


class Alert(models.Model):
    rule = models.CharField(max_length=50, unique=True)
    status = models.CharField(max_length=10, choices=AlertStatus.choices)
    value = models.FloatField(help_text="the rule's figure at the last transition")
    threshold = models.FloatField()
    message = models.TextField()
    fired_at = models.DateTimeField(help_text="when it last fired (the cooldown counts from it)")
    resolved_at = models.DateTimeField(null=True, blank=True)
    fire_count = models.PositiveIntegerField(default=1)

    class Meta:
        indexes = [
            # The dashboard card and /metrics: the alerts firing now.
            models.Index(
                fields=["status"], name="alert_firing", condition=models.Q(status="firing")
            ),
        ]

    def __str__(self) -> str:
        return f"alert {self.rule} [{self.status}]"


class AlertTransition(models.Model):
    """The history: one row per firing and per resolution."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="transitions")
    status = models.CharField(max_length=10, choices=AlertStatus.choices)
    value = models.FloatField()
    message = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The Metrics page: the latest transitions, newest first.
            models.Index(fields=["-created_at"], name="alerttransition_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.alert_id} -> {self.status}"


class MetricSample(models.Model):
    """The figures of one alerter tick (name -> value), kept for the Metrics page's charts."""

    at = models.DateTimeField()
    values = models.JSONField(default=dict)

    class Meta:
        indexes = [
            # The charts (samples since an hour ago) and the pruning (samples before it).
            models.Index(fields=["at"], name="metricsample_at"),
        ]

    def __str__(self) -> str:
        return f"sample {self.at:%H:%M:%S}"
