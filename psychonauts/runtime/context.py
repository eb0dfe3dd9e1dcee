"""Keeping a request within the model's context: an endpoint that registers its context size
(`Endpoint.context_tokens`) gets conversations trimmed to fit, oldest tool output first.

The stored turns are never changed: the trimmed conversation is built anew for each request,
and each trimmed piece says what was left out, so the model knows to read a file again rather
than trust a memory it does not have.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from psychonauts.routing.providers.base import Message, ToolSpec

# Characters per token, low on purpose: code, JSON and non-English text take more tokens per
# character than prose, and a chat template adds its own around every message and tool.
CHARS_PER_TOKEN = 3
# The share of the context the estimate may fill: what the estimate misses must still fit.
MARGIN = 0.85
# The conversation's latest messages stay whole: they are what the model is working on.
KEEP_LAST = 2
# Pieces shorter than this are not worth a marker.
TRIM_MIN = 200
MARK = "[left out to keep the conversation within the model's context: {n} characters of {what}]"


@dataclass(frozen=True)
class Fitted:
    """A conversation made to fit: its messages, how many pieces were trimmed and how many
    characters they held."""

    messages: list[Message]
    trimmed: int = 0
    chars: int = 0


def output_tokens(max_tokens: int, context_tokens: int | None) -> int:
    """The answer's limit: at most a quarter of a bounded context, so a prompt has room."""
    if not context_tokens:
        return max_tokens
    return max(256, min(max_tokens, context_tokens // 4))


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


def messages_fit(
    messages: list[Message],
    *,
    system: str,
    tools: list[ToolSpec],
    context_tokens: int | None,
    max_tokens: int,
) -> Fitted:
    """`messages` within `context_tokens` (estimated) together with the system prompt, the
    tools and an answer of `max_tokens`: tool results first, then tool call inputs (a file's
    whole content written), then the assistant's text, oldest first, are replaced by a marker
    saying how much was left out; the first message (the task) and the latest KEEP_LAST stay,
    but a latest tool result too long for the context on its own keeps its head and its tail.
    Unchanged when there is no bound or it fits already."""
    if not context_tokens:
        return Fitted(messages)
    budget = int(context_tokens * MARGIN - max_tokens) * CHARS_PER_TOKEN
    budget -= len(system) + _size(tools)
    over = _size(messages) - budget
    if over <= 0:
        return Fitted(messages)
    fitted = copy.deepcopy(messages)
    trimmable = range(1, max(1, len(fitted) - KEEP_LAST))
    trimmed = chars = 0
    for kind in ("tool_result", "tool_use", "text"):
        for index in trimmable:
            content = fitted[index]["content"]
            if isinstance(content, str):
                if kind == "text" and len(content) >= TRIM_MIN:
                    fitted[index]["content"] = MARK.format(n=len(content), what="a message")
                    trimmed, chars, over = trimmed + 1, chars + len(content), over - len(content)
            else:
                for block in content:
                    cut = _trim_block(block, kind)
                    if cut:
                        trimmed, chars, over = trimmed + 1, chars + cut, over - cut
                    if over <= 0:
                        break
            if over <= 0:
                return Fitted(fitted, trimmed, chars)
    # Still over: the latest tool results alone are too long (a whole large file read). Each
    # keeps its head and its tail, the middle left out with a marker.
    for index in range(max(1, len(fitted) - KEEP_LAST), len(fitted)):
        content = fitted[index]["content"]
        if isinstance(content, str):
            continue
        for block in content:
            text = block.get("content") if block.get("type") == "tool_result" else None
            if not isinstance(text, str) or len(text) < TRIM_MIN * 4:
                continue
            keep = max(TRIM_MIN * 2, len(text) - over - len(MARK))
            left_out = len(text) - keep
            mark = MARK.format(n=left_out, what="the middle of this tool result")
            block["content"] = f"{text[: keep * 2 // 3]}\n{mark}\n{text[-(keep // 3) :]}"
            trimmed, chars, over = trimmed + 1, chars + left_out, over - left_out
            if over <= 0:
                return Fitted(fitted, trimmed, chars)
    return Fitted(fitted, trimmed, chars)


def _trim_block(block: dict[str, Any], kind: str) -> int:
    """Replace a block's bulk by a marker when it is of `kind`; the characters left out."""
    if block.get("type") != kind:
        return 0
    if kind == "tool_result":
        content = block.get("content", "")
        size = len(content) if isinstance(content, str) else _size(content)
        if size < TRIM_MIN:
            return 0
        block["content"] = MARK.format(n=size, what="this tool result")
        return size
    if kind == "tool_use":
        cut = 0
        for key, value in list(block.get("input", {}).items()):
            if isinstance(value, str) and len(value) >= TRIM_MIN:
                block["input"][key] = MARK.format(n=len(value), what=f"`{key}`")
                cut += len(value)
        return cut
    text = block.get("text", "")
    if len(text) < TRIM_MIN:
        return 0
    block["text"] = MARK.format(n=len(text), what="this text")
    return len(text)
