from __future__ import annotations

from django.apps import AppConfig


class TetherConfig(AppConfig):
    name = "tether"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The tether plugs into the apps below it: tether/hooks.py."""
        from tether import hooks  # noqa: F401
