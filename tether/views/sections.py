"""The Grounding page's sections (tether.sections, where apps above tether register them)."""

from __future__ import annotations

from tether.sections import (
    GROUNDING_SECTIONS,
    GroundingSection,
    grounding_section_register,
    grounding_sections,
)

__all__ = [
    "GROUNDING_SECTIONS",
    "GroundingSection",
    "grounding_section_register",
    "grounding_sections",
]
