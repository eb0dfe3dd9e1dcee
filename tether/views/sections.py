"""Sections that apps above tether add to the Grounding page, registered from their hooks.py
(`GROUNDING_SECTIONS.register(GroundingSection(...))`): tether renders them without importing
those apps. A section is keyed by its template."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from core.hooks import Hook


@dataclass(frozen=True)
class GroundingSection:
    """A template included on the Grounding page after the pipeline mutations, with the
    context its function returns for the request."""

    template: str
    context: Callable[[HttpRequest], dict[str, Any]]


GROUNDING_SECTIONS: Hook[GroundingSection] = Hook(
    "tether.grounding_sections", key=lambda s: s.template
)


def grounding_sections(request: HttpRequest) -> list[dict[str, Any]]:
    return [{"template": s.template, "ctx": s.context(request)} for s in GROUNDING_SECTIONS]
