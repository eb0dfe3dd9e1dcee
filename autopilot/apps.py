from __future__ import annotations

from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The autopilot plugs into the apps below it: autopilot/hooks.py."""
        from autopilot import hooks  # noqa: F401
