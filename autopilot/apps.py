from __future__ import annotations

from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"
