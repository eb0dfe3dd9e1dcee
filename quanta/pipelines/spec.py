"""The shapes of a pipeline as it crosses boundaries: YAML -> spec -> rows -> run snapshot."""

from __future__ import annotations

from typing import Any, TypedDict


class AgentSpec(TypedDict):
    role: str
    settings: dict[str, Any]  # per-agent overrides: provider, model, max_turns ...


class StageSpec(TypedDict):
    index: int
    name: str
    mode: str  # StageMode
    agents: list[AgentSpec]
    condition: str
    retries: int
    timeout_s: int


class PipelineSpec(TypedDict):
    name: str
    description: str
    match_labels: list[str]
    match_kinds: list[str]
    is_default: bool
    stages: list[StageSpec]


class PipelineSnapshot(PipelineSpec):
    """What a QuantumRun keeps: the definition it started with, whatever happens later."""

    version: int
