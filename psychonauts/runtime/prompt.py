"""The first message an agent reads: its quantum, the context threaded to it, who it is."""

from __future__ import annotations

from collections.abc import Callable

from bursts.models import AgentRun
from core.hooks import Hook
from psychonauts.runtime.loops import loop_section


def _loops(run: AgentRun) -> str:
    return loop_section(run.quantum_id)


# Sections added to every prompt, in order, after the context: f(agent_run) -> text, or "" to
# add nothing to this run's prompt. The runtime's own loops first; apps above register theirs.
PromptSection = Callable[[AgentRun], str]
PROMPT_SECTIONS: Hook[PromptSection] = Hook("psychonauts.prompt_sections")
PROMPT_SECTIONS.register(_loops)


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
