from __future__ import annotations

from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from autopilot.tools import PROPOSE_GOAL, SUBMIT_PLAN
        from psychonauts.tools import tool_register

        tool_register(SUBMIT_PLAN)
        tool_register(PROPOSE_GOAL)
