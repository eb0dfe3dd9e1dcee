"""Context threading: what an agent is told about the work done before it (the seed's format).

## Stage 0 Results

### Agent: 42_s0_planner
<the planner's result, at most 10,000 characters>
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RESULT_LIMIT = 10_000


@dataclass(frozen=True)
class PriorResult:
    stage_index: int
    agent_id: str
    result: str


def truncate(text: str, limit: int = RESULT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... truncated: {len(text) - limit} more characters]"


def context_thread(results: Iterable[PriorResult]) -> str:
    """Group results by stage, in stage then given order; each result cut at RESULT_LIMIT."""
    by_stage: dict[int, list[PriorResult]] = {}
    for item in results:
        by_stage.setdefault(item.stage_index, []).append(item)
    parts: list[str] = []
    for stage_index in sorted(by_stage):
        parts.append(f"## Stage {stage_index} Results\n")
        for item in by_stage[stage_index]:
            parts.append(f"### Agent: {item.agent_id}\n{truncate(item.result)}\n")
    return "\n".join(parts)
