from __future__ import annotations

from django.apps import AppConfig


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The autopilot takes part in the layers below through their hooks: the budgets' gate
        and recorder around every model call, the planner's and contemplator's tools, and the
        auto-merge policy for its own low-risk changes."""
        from autopilot.merging import autopilot_auto_merge
        from autopilot.services.budgets import spend_call_record, spend_gate
        from autopilot.tools import PROPOSE_GOAL, SUBMIT_PLAN
        from psychonauts.runtime.budget import spend_gate_register, spend_recorder_register
        from psychonauts.runtime.tools import tool_register
        from tether.services.changes import AUTO_MERGE_POLICIES

        spend_gate_register(spend_gate)
        spend_recorder_register(spend_call_record)
        tool_register(SUBMIT_PLAN)
        tool_register(PROPOSE_GOAL)
        if autopilot_auto_merge not in AUTO_MERGE_POLICIES:
            AUTO_MERGE_POLICIES.append(autopilot_auto_merge)
