"""Sections that apps above psychonauts add to the Focus page, registered from their hooks.py
(`FOCUS_SECTIONS.register(FocusSection(...))`): the page renders them without importing those
apps. A section is keyed by its template."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bursts.models import AgentRun
from core.hooks import Hook


@dataclass(frozen=True)
class FocusSection:
    """A template included on an agent run's Focus page, with the context its function
    returns for the run (the template reads it as `ctx`)."""

    template: str
    context: Callable[[AgentRun], dict[str, Any]]


FOCUS_SECTIONS: Hook[FocusSection] = Hook("psychonauts.focus_sections", key=lambda s: s.template)


def focus_sections(run: AgentRun) -> list[dict[str, Any]]:
    return [{"template": s.template, "ctx": s.context(run)} for s in FOCUS_SECTIONS]
