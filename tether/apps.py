from __future__ import annotations

from django.apps import AppConfig


class TetherConfig(AppConfig):
    name = "tether"
    default_auto_field = "django.db.models.BigAutoField"
