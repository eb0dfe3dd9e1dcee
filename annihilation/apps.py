from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "annihilation"
    verbose_name = "Annihilation core"
    default_auto_field = "django.db.models.BigAutoField"
