"""Where the tether plugs into the apps below it (core.hooks), and nowhere else: imported by
`TetherConfig.ready()`."""

from __future__ import annotations

from bursts.hooks import ON_RUNS_DRAINED
from psychonauts.executors.permission import PERMISSION_PROMPT
from psychonauts.runtime.tools import TOOLS
from quanta.hooks import ON_STATUS_CHANGED
from tether.services.drained import runs_drained
from tether.services.reachings import reachings_withdraw_for_status
from tether.tools import ASK_TETHER, PERMISSION, PROPOSE_PIPELINE_CHANGE

TOOLS.register(ASK_TETHER)
TOOLS.register(PROPOSE_PIPELINE_CHANGE)
ON_RUNS_DRAINED.register(runs_drained)
ON_STATUS_CHANGED.register(reachings_withdraw_for_status)
PERMISSION_PROMPT.register(PERMISSION)
