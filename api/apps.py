from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The HTTP API for other programs: tokens, the endpoints, incoming webhooks."""

    name = "api"
    default_auto_field = "django.db.models.BigAutoField"
