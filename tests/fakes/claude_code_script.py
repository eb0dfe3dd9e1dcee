"""Scripted answers for Claude Code against the fake Messages API (`anthropic_server`).

Claude Code's tools are its own (`Write`, `Edit`, `Bash`, ...). A script is a list of steps;
the reply to an agent request is the step after as many tool results as its conversation holds,
so the CLI's own retries and side requests (no tools offered) do not shift the script.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.anthropic_server import FakeReply


def _tool_results(body: dict[str, Any]) -> int:
    count = 0
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            count += sum(
                1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
            )
    return count


def claude_code_script(steps: list[FakeReply]) -> Callable[[dict[str, Any]], FakeReply]:
    def reply(body: dict[str, Any]) -> FakeReply:
        if not body.get("tools"):
            return FakeReply(text="ok")  # a side request (a title, a summary)
        done = _tool_results(body)
        return steps[done] if done < len(steps) else FakeReply(text="(script finished)")

    return reply
