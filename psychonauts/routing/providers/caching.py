"""Prompt caching for the Messages API: where a request's cache breakpoints go.

The API caches a request's prefix (tools, then system, then messages) up to each block marked
with `cache_control`, at most four marks a request, and looks for an earlier entry at most 20
blocks back from each mark. An agent's requests grow by one assistant turn and one user turn at
a time, so four marks cover what it repeats:

1. the last tool: the tool definitions, shared by every agent with the same tools;
2. the system prompt: the role's prompt (the same for every agent of the role: what differs
   between agents, the quantum, the injected playbook rules and skill, is in the first user
   message, after it), so a wave of agents of one role writes it once and reads it after;
3. the last block of the user message before the last one: where the previous request put
   its rolling mark, so this request reads what the previous one wrote even when the turn in
   between added more than 20 blocks (many parallel tool calls);
4. the last block of the last message: the rolling mark, written now for the next turn.

A long TTL ("1h", written at twice the input price instead of 1.25 times) goes on the rolling
marks only when the request says so (`long_ttl`): an agent that is likely to wait longer than
five minutes before its next turn. The API requires marks with a long TTL to come before marks
with the default one, which is why the tools and system marks share it then too.
"""

from __future__ import annotations

from typing import Any

from psychonauts.routing.providers.base import Message, ToolSpec

MAX_BREAKPOINTS = 4


def _mark(long_ttl: bool) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": "1h"} if long_ttl else {"type": "ephemeral"}


def _marked_message(message: Message, mark: dict[str, str]) -> dict[str, Any]:
    """A copy of `message` whose last content block carries `mark` (the request's own message
    list is the runner's and is never changed)."""
    content = message["content"]
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}]
    else:
        blocks = list(content)
    if not blocks:
        return dict(message)
    blocks[-1] = {**blocks[-1], "cache_control": mark}
    return {"role": message["role"], "content": blocks}


def cached_body(
    *, system: str, tools: list[ToolSpec], messages: list[Message], long_ttl: bool = False
) -> dict[str, Any]:
    """The `system`, `tools` and `messages` of a Messages API request, with cache breakpoints."""
    mark = _mark(long_ttl)
    body: dict[str, Any] = {}
    if system:
        body["system"] = [{"type": "text", "text": system, "cache_control": mark}]
    if tools:
        body["tools"] = [*tools[:-1], {**tools[-1], "cache_control": mark}]
    marked = list[Any](messages)
    user_indexes = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if marked:
        marked[-1] = _marked_message(messages[-1], mark)
    # The previous request's rolling mark: the user message before the last one.
    previous = [i for i in user_indexes if i < len(messages) - 1]
    if previous:
        marked[previous[-1]] = _marked_message(messages[previous[-1]], mark)
    body["messages"] = marked
    return body
