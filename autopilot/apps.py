from __future__ import annotations

from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from autopilot.services.budgets import spend_call_record, spend_gate
        from psychonauts.services.budget import spend_gate_register, spend_recorder_register

        spend_gate_register(spend_gate)
        spend_recorder_register(spend_call_record)

        from autopilot.tools import PROPOSE_GOAL, SUBMIT_PLAN
        from psychonauts.tools import tool_register

        tool_register(SUBMIT_PLAN)
        tool_register(PROPOSE_GOAL)

        from autopilot.merging import autopilot_auto_merge
        from tether.services.changes import AUTO_MERGE_POLICIES

        if autopilot_auto_merge not in AUTO_MERGE_POLICIES:
            AUTO_MERGE_POLICIES.append(autopilot_auto_merge)
