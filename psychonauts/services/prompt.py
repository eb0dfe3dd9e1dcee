"""The first message an agent reads: its quantum, the context threaded to it, who it is."""

from __future__ import annotations

from bursts.models import AgentRun
from psychonauts.loops import loop_section
from psychonauts.sections import PROMPT_SECTIONS


def _loops(run: AgentRun) -> str:
    return loop_section(run.quantum_id)


# The loops' section comes first; other apps append theirs (psychonauts.sections).
if _loops not in PROMPT_SECTIONS:
    PROMPT_SECTIONS.insert(0, _loops)

__all__ = ["PROMPT_SECTIONS", "agent_prompt"]


def agent_prompt(run: AgentRun) -> str:
    q = run.quantum
    parts = [f"# Quantum #{q.pk}: {q.title}", f"kind: {q.kind}; complexity: {q.complexity}"]
    if q.labels:
        parts.append("labels: " + ", ".join(q.labels))
    if q.body:
        parts.append(q.body)
    if q.acceptance:
        parts.append("## Acceptance criteria\n" + q.acceptance)
    if q.verify_commands:
        parts.append("## Verification commands\n" + "\n".join(q.verify_commands))
    if run.context:
        parts.append("## Context\n" + run.context)
    for section in PROMPT_SECTIONS:
        text = section(run)
        if text:
            parts.append(text)
    parts.append(f"You are agent {run.agent_id} (attempt {run.attempt}, role {run.role}).")
    return "\n\n".join(parts)
