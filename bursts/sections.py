"""Sections that apps above bursts add to the wave page, registered from their
AppConfig.ready(): bursts renders them, and redraws them live, without importing those apps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.events import EventMessage


@dataclass(frozen=True)
class WaveSection:
    """A template included on the wave page below the timeline.

    `context(wave_id)` is its template context (the template reads it as `ctx`). The page
    follows `topics` too; an event of one of them redraws the section when `wave_of(event)`
    names the wave on screen (None: the event concerns no wave, or one that is gone).
    The template's top-level element carries an id and `data-swap="replace"`; the app adds
    `live/wave/<topic kind>/_any.html`, which includes the `sections` it is given.
    """

    template: str
    context: Callable[[int], dict[str, Any]]
    topics: tuple[str, ...] = ()
    wave_of: Callable[[EventMessage], int | None] = lambda event: None


WAVE_SECTIONS: list[WaveSection] = []


def wave_section_register(section: WaveSection) -> None:
    """Add a section once (ready() may run again in tests)."""
    if all(s.template != section.template for s in WAVE_SECTIONS):
        WAVE_SECTIONS.append(section)


def wave_section_topics() -> list[str]:
    """The topics the wave page follows for its sections, each once, in registration order."""
    return list(dict.fromkeys(t for s in WAVE_SECTIONS for t in s.topics))


def wave_sections(wave_id: int, *, event: EventMessage | None = None) -> list[dict[str, Any]]:
    """The sections to render for the wave: all of them (event None), or those an event of
    their topics redraws."""
    chosen = (
        WAVE_SECTIONS
        if event is None
        else [
            s for s in WAVE_SECTIONS if event["topic"] in s.topics and s.wave_of(event) == wave_id
        ]
    )
    return [{"template": s.template, "ctx": s.context(wave_id)} for s in chosen]
