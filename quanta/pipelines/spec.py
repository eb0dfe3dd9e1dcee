"""The shapes of a pipeline as it crosses boundaries: YAML -> spec -> rows -> run snapshot."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


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
    # Added later: snapshots of runs started before them lack these keys, so readers of a
    # snapshot use `.get(key, STAGE_DEFAULTS[key])`.
    verify: NotRequired[bool]  # run the quantum's verify commands after the stage's agents
    verify_retries: NotRequired[int]  # attempts an agent gets to fix failed checks
    verdict: NotRequired[str]  # VerdictPolicy: what a reviewer's negative verdict does


STAGE_DEFAULTS: dict[str, Any] = {"verify": False, "verify_retries": 2, "verdict": "block"}


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
