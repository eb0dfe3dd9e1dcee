from __future__ import annotations

from django.apps import AppConfig

from core.redaction import extra_patterns_check, install_log_redaction


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process loads the apps (web, Celery workers, commands): from here on no log
        # record of it carries a secret, whichever handlers are installed later.
        extra_patterns_check()
        install_log_redaction()
