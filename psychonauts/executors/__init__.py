"""Executors: who runs an agent's loop. `ours` is the runtime's own loop
(`psychonauts.runtime.runner`); `claude-code` and `codex` run an agent CLI as one process per
agent run inside the quantum's sandbox, behind a model gateway the worker owns
(`psychonauts.executors.gateway`). A role's `executor` field chooses."""

from __future__ import annotations

from psychonauts.executors.base import (
    EXECUTORS,
    OURS,
    ExecutorStatus,
    executor_status,
    executors_status,
)

__all__ = ["EXECUTORS", "OURS", "ExecutorStatus", "executor_status", "executors_status"]
