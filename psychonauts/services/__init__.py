"""Writes of the psychonauts app: executing agent runs, creating them, sweeping worktrees."""

from __future__ import annotations

from psychonauts.roles import roles_load, roles_sync_defaults
from psychonauts.services.execute import agent_run_execute
from psychonauts.services.runner import Observer
from psychonauts.services.runs import agent_run_create, tool_call_complete
from psychonauts.services.sweep import workspaces_sweep

__all__ = [
    "Observer",
    "agent_run_create",
    "agent_run_execute",
    "roles_load",
    "roles_sync_defaults",
    "tool_call_complete",
    "workspaces_sweep",
]
