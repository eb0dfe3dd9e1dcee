"""Where reflection plugs into the apps below it (core.hooks), and nowhere else: imported by
`ReflectionConfig.ready()`."""

from __future__ import annotations

import logging

from django.db import transaction

from bursts.hooks import ON_BURST_CLOSED, ON_RUNS_DRAINED
from bursts.models import Burst
from bursts.sections import WAVE_SECTIONS, WaveSection
from core.events import EventMessage
from psychonauts.runtime.prompt import PROMPT_SECTIONS
from psychonauts.sections import FOCUS_SECTIONS, FocusSection
from reflection.models import ReflectionRunStatus
from reflection.selectors import reflection_event_wave
from reflection.services.injection import on_runs_drained, playbook_section
from reflection.tasks import reflection_chain
from reflection.views import (
    focus_playbook_context,
    grounding_deltas_context,
    wave_reflection_context,
)
from tether.views.sections import GROUNDING_SECTIONS, GroundingSection

logger = logging.getLogger(__name__)


def on_burst_closed(burst: Burst) -> None:
    """Reflect on the closed burst: its chain is sent once the closing transaction commits."""
    burst_id = burst.pk

    def send() -> None:
        try:
            reflection_chain(burst_id).apply_async()
        except Exception:  # a broker outage must not fail the wave
            logger.exception("reflection of burst %s could not be sent", burst_id)

    transaction.on_commit(send)


def wave_of(event: EventMessage) -> int | None:
    """The wave a reflection event concerns."""
    return reflection_event_wave(event["payload"])


PROMPT_SECTIONS.register(playbook_section)
ON_RUNS_DRAINED.register(on_runs_drained)
ON_BURST_CLOSED.register(on_burst_closed)
GROUNDING_SECTIONS.register(
    GroundingSection("reflection/_grounding_deltas.html", grounding_deltas_context)
)
# The wave page's reflection runs, redrawn live on every `reflection:<status>` event of the wave.
WAVE_SECTIONS.register(
    WaveSection(
        "reflection/_wave_reflection.html",
        wave_reflection_context,
        topics=tuple(f"reflection:{s}" for s in ReflectionRunStatus.values),
        wave_of=wave_of,
    )
)
# The Focus page's injected rules and skill.
FOCUS_SECTIONS.register(FocusSection("reflection/_focus_playbook.html", focus_playbook_context))
