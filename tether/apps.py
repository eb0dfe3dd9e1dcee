from __future__ import annotations

from django.apps import AppConfig


class TetherConfig(AppConfig):
    name = "tether"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bursts.hooks import ON_RUNS_DRAINED
        from psychonauts.tools import tool_register
        from quanta.hooks import ON_STATUS_CHANGED
        from tether.hooks import on_runs_drained, reachings_withdraw_for_status
        from tether.tools import ASK_TETHER, PROPOSE_PIPELINE_CHANGE

        tool_register(ASK_TETHER)
        tool_register(PROPOSE_PIPELINE_CHANGE)
        if on_runs_drained not in ON_RUNS_DRAINED:
            ON_RUNS_DRAINED.append(on_runs_drained)
        if reachings_withdraw_for_status not in ON_STATUS_CHANGED:
            ON_STATUS_CHANGED.append(reachings_withdraw_for_status)
