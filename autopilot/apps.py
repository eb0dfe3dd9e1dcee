from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from psychonauts.budget_hooks import CallCheck, CallSpend


class AutopilotConfig(AppConfig):
    name = "autopilot"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The autopilot takes part in the layers below through their hooks: the budgets' gate
        and recorder around every model call, the planner's and contemplator's tools, and the
        auto-merge policy for its own low-risk changes."""
        from autopilot.merging import autopilot_auto_merge
        from autopilot.tools import PROPOSE_GOAL, SUBMIT_PLAN
        from psychonauts.budget_hooks import spend_gate_register, spend_recorder_register
        from psychonauts.tools import tool_register
        from tether.hooks import AUTO_MERGE_POLICIES

        spend_gate_register(_spend_gate)
        spend_recorder_register(_spend_call_record)
        tool_register(SUBMIT_PLAN)
        tool_register(PROPOSE_GOAL)
        if autopilot_auto_merge not in AUTO_MERGE_POLICIES:
            AUTO_MERGE_POLICIES.append(autopilot_auto_merge)


# The budgets' services are loaded by the first model call, in the worker that makes it: every
# process registers the hooks, and a command that calls no model then loads none of them.
def _spend_gate(check: CallCheck) -> None:
    from autopilot.services.budgets import spend_gate

    spend_gate(check)


def _spend_call_record(call: CallSpend) -> None:
    from autopilot.services.budgets import spend_call_record

    spend_call_record(call)
