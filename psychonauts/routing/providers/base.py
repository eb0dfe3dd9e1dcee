"""The provider interface: streaming text deltas in, a final message with content and usage out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict

from psychonauts.errors import CallPastDeadline


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str
    is_error: bool


ContentBlock = TextBlock | ToolUseBlock


class Message(TypedDict):
    role: Literal["user", "assistant"]
    content: str | list[Any]


class ToolSpec(TypedDict):
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """What a provider may know about the run (the scripted provider picks its script by it)."""

    agent_run_id: int
    agent_id: str
    role: str
    attempt: int
    quantum_id: int
    labels: tuple[str, ...] = ()
    depth: int = 0


@dataclass(frozen=True)
class ProviderRequest:
    model: str
    system: str
    messages: list[Message]
    tools: list[ToolSpec]
    max_tokens: int
    run: RunInfo
    # The agent is likely to wait longer than the cache's five minutes before its next turn:
    # what this call caches is kept for an hour (see providers.caching).
    long_cache: bool = False
    # When the agent run's time runs out, on time.monotonic()'s clock (None: no limit). A
    # streaming provider calls `deadline_check` on every event it reads.
    deadline: float | None = None

    def deadline_check(self) -> None:
        """CallPastDeadline once the run's time has run out."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CallPastDeadline(f"{self.model} was still answering when the run's time ran out")

    def time_left(self) -> float | None:
        """Seconds until the run's time runs out (0 when it has), None without a limit."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class ProviderResponse:
    content: list[ContentBlock]
    stop_reason: str
    tokens_in: int = 0  # input tokens read from no cache and written to none
    tokens_out: int = 0
    model: str = ""
    # Input tokens read from the provider's prompt cache, and written to it (for five minutes,
    # or for an hour): with tokens_in, the whole prompt.
    cache_read: int = 0
    cache_write: int = 0
    cache_write_long: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(b["text"] for b in self.content if b["type"] == "text")

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if b["type"] == "tool_use"]


OnText = Callable[[str], None]


class Provider(Protocol):
    name: str
    uses_llm: bool

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        """One model turn. Raises ProviderError once its retries are spent."""
        ...


def expect_str(value: Any) -> str:
    """`value` when it is a string (a provider reading its API's answer); TypeError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def expect_int(value: Any) -> int:
    """`value` when it is an integer and not a bool; TypeError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value
