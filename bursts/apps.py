from __future__ import annotations

from django.apps import AppConfig


class BurstsConfig(AppConfig):
    name = "bursts"
    default_auto_field = "django.db.models.BigAutoField"
