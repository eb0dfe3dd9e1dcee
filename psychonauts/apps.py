from __future__ import annotations

from django.apps import AppConfig


class PsychonautsConfig(AppConfig):
    name = "psychonauts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The agent runtime plugs into the apps below it: psychonauts/hooks.py."""
        from psychonauts import hooks  # noqa: F401
