"""Sections that apps above psychonauts add to the Focus page and to every agent's prompt,
registered from their AppConfig.ready(): the page and the prompt render them without importing
those apps. This module imports no service, so that registering costs a process nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bursts.models import AgentRun


@dataclass(frozen=True)
class FocusSection:
    """A template included on an agent run's Focus page, with the context its function
    returns for the run (the template reads it as `ctx`)."""

    template: str
    context: Callable[[AgentRun], dict[str, Any]]


FOCUS_SECTIONS: list[FocusSection] = []

# Sections added to every prompt, in order, after the context: f(agent_run) -> text, or "" to
# add nothing to this run's prompt (psychonauts.services.prompt puts its own first).
PROMPT_SECTIONS: list[Callable[[AgentRun], str]] = []


def focus_section_register(section: FocusSection) -> None:
    """Add a section once (ready() may run again in tests)."""
    if all(s.template != section.template for s in FOCUS_SECTIONS):
        FOCUS_SECTIONS.append(section)


def focus_sections(run: AgentRun) -> list[dict[str, Any]]:
    return [{"template": s.template, "ctx": s.context(run)} for s in FOCUS_SECTIONS]
