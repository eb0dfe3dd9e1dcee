"""Claude Code's permission prompts (`--permission-prompt-tool`, served over MCP): the tool that
answers them is the tether's (it asks the operator, never an automatic yes), registered here by
the tether app; without it a CLI gets no permission tool."""

from __future__ import annotations

from core.hooks import Hook
from psychonauts.runtime.tools import Tool

PERMISSION_TOOL = "permission_prompt"
PERMISSION_PROMPT: Hook[Tool] = Hook(
    "psychonauts.executors.permission_prompt", key=lambda tool: tool.name, single=True
)
