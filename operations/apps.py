from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Running the system: metrics, alerts, outgoing webhooks and structured logs."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Operations plugs into Celery's signals: operations/hooks.py."""
        from operations import hooks  # noqa: F401
