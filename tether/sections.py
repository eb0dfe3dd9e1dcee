"""Sections that apps above tether add to the Grounding page, registered from their
AppConfig.ready(): tether renders them without importing those apps. This module imports no
view and no service, so that registering costs a process nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest


@dataclass(frozen=True)
class GroundingSection:
    """A template included on the Grounding page after the pipeline mutations, with the
    context its function returns for the request."""

    template: str
    context: Callable[[HttpRequest], dict[str, Any]]


GROUNDING_SECTIONS: list[GroundingSection] = []


def grounding_section_register(section: GroundingSection) -> None:
    """Add a section once (ready() may run again in tests)."""
    if all(s.template != section.template for s in GROUNDING_SECTIONS):
        GROUNDING_SECTIONS.append(section)


def grounding_sections(request: HttpRequest) -> list[dict[str, Any]]:
    return [{"template": s.template, "ctx": s.context(request)} for s in GROUNDING_SECTIONS]
