"""Sections that apps above bursts add to the wave page, registered from their hooks.py
(`WAVE_SECTIONS.register(WaveSection(...))`): bursts renders them, and redraws them live,
without importing those apps. A section is keyed by its template: registered again, it is
replaced in its place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.events import EventMessage
from core.hooks import Hook


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


WAVE_SECTIONS: Hook[WaveSection] = Hook("bursts.wave_sections", key=lambda s: s.template)


def wave_section_topics() -> list[str]:
    """The topics the wave page follows for its sections, each once, in registration order."""
    return list(dict.fromkeys(t for s in WAVE_SECTIONS for t in s.topics))


def wave_sections(wave_id: int, *, event: EventMessage | None = None) -> list[dict[str, Any]]:
    """The sections to render for the wave: all of them (event None), or those an event of
    their topics redraws."""
    chosen = (
        list(WAVE_SECTIONS)
        if event is None
        else [
            s for s in WAVE_SECTIONS if event["topic"] in s.topics and s.wave_of(event) == wave_id
        ]
    )
    return [{"template": s.template, "ctx": s.context(wave_id)} for s in chosen]
