from __future__ import annotations

from django.apps import AppConfig


class PsychonautsConfig(AppConfig):
    name = "psychonauts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from psychonauts.selectors import role_names
        from psychonauts.verify import verify_command_problem
        from quanta.fields import verify_command_check_source
        from quanta.pipelines.services import role_names_source

        role_names_source(role_names)
        verify_command_check_source(verify_command_problem)
