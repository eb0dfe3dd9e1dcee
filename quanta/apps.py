from __future__ import annotations

from django.apps import AppConfig


class QuantaConfig(AppConfig):
    name = "quanta"
    default_auto_field = "django.db.models.BigAutoField"
