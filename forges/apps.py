from __future__ import annotations

from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    verbose_name = "Forges (pull requests)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The forges app plugs into the tether: forges/hooks.py."""
        from forges import hooks  # noqa: F401
