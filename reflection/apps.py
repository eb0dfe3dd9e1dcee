from __future__ import annotations

from django.apps import AppConfig


class ReflectionConfig(AppConfig):
    name = "reflection"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Reflection plugs into the apps below it: reflection/hooks.py."""
        from reflection import hooks  # noqa: F401
