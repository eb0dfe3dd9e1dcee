from __future__ import annotations

from django.apps import AppConfig


class HooksConfig(AppConfig):
    """Webhooks: signed deliveries to configured URLs, and GitHub's deliveries in."""

    name = "hooks"
    default_auto_field = "django.db.models.BigAutoField"
