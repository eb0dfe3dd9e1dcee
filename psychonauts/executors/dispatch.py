"""Which loop runs an agent run: the role's `executor` chooses."""

from __future__ import annotations

from psychonauts.executors.base import CLAUDE_CODE, CODEX, OURS, ExecutorError
from psychonauts.models import Role
from psychonauts.runtime.runner import Runner


def runner_class(role: Role) -> type[Runner]:
    """The Runner (sub)class for a role's executor; ExecutorError for one that cannot run."""
    executor = getattr(role, "executor", OURS) or OURS
    if executor == OURS:
        return Runner
    if executor == CLAUDE_CODE:
        from psychonauts.executors.claude_code import ClaudeCodeRunner

        return ClaudeCodeRunner
    if executor == CODEX:
        from psychonauts.executors.codex import CodexRunner

        return CodexRunner
    raise ExecutorError(f"role {role.name!r} names an unknown executor {executor!r}")
