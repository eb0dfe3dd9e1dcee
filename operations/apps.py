from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Running the system: metrics, alerts, outgoing webhooks and structured logs."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"
