from __future__ import annotations

from django.apps import AppConfig


class ReflectionConfig(AppConfig):
    name = "reflection"
    default_auto_field = "django.db.models.BigAutoField"
