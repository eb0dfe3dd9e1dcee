from __future__ import annotations

from django.apps import AppConfig


class PsychonautsConfig(AppConfig):
    name = "psychonauts"
    default_auto_field = "django.db.models.BigAutoField"
