"""Where the autopilot plugs into the apps below it (core.hooks), and nowhere else: imported by
`AutopilotConfig.ready()`. The budgets' gate and recorder around every model call, the
planner's and contemplator's tools, and the auto-merge policy for its own low-risk changes."""

from __future__ import annotations

from autopilot.merging import autopilot_auto_merge
from autopilot.services.budgets import spend_call_record, spend_gate
from autopilot.tools import PROPOSE_GOAL, SUBMIT_PLAN
from psychonauts.runtime.budget import SPEND_GATES, SPEND_RECORDERS
from psychonauts.runtime.tools import TOOLS
from tether.services.changes import AUTO_MERGE_POLICIES

SPEND_GATES.register(spend_gate)
SPEND_RECORDERS.register(spend_call_record)
TOOLS.register(SUBMIT_PLAN)
TOOLS.register(PROPOSE_GOAL)
AUTO_MERGE_POLICIES.register(autopilot_auto_merge)
