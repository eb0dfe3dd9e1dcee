from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.db import transaction

logger = logging.getLogger(__name__)


class ReflectionConfig(AppConfig):
    name = "reflection"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bursts.hooks import ON_RUNS_DRAINED
        from psychonauts.sections import PROMPT_SECTIONS
        from reflection.hooks import on_runs_drained, playbook_section

        if playbook_section not in PROMPT_SECTIONS:
            PROMPT_SECTIONS.append(playbook_section)
        if on_runs_drained not in ON_RUNS_DRAINED:
            ON_RUNS_DRAINED.append(on_runs_drained)
        from bursts.hooks import ON_BURST_CLOSED

        if _on_burst_closed not in ON_BURST_CLOSED:
            ON_BURST_CLOSED.append(_on_burst_closed)

        from reflection.views import grounding_deltas_context
        from tether.sections import GroundingSection, grounding_section_register

        grounding_section_register(
            GroundingSection("reflection/_grounding_deltas.html", grounding_deltas_context)
        )
        _register_page_sections()


def _register_page_sections() -> None:
    """The wave page's reflection runs (redrawn live on every `reflection:<status>` event of
    the wave) and the Focus page's injected rules and skill."""
    from bursts.sections import WaveSection, wave_section_register
    from core.events import EventMessage
    from psychonauts.sections import FocusSection, focus_section_register
    from reflection.models import ReflectionRunStatus
    from reflection.selectors import reflection_event_wave
    from reflection.views import focus_playbook_context, wave_reflection_context

    def wave_of(event: EventMessage) -> int | None:
        return reflection_event_wave(event["payload"])

    wave_section_register(
        WaveSection(
            "reflection/_wave_reflection.html",
            wave_reflection_context,
            topics=tuple(f"reflection:{s}" for s in ReflectionRunStatus.values),
            wave_of=wave_of,
        )
    )
    focus_section_register(FocusSection("reflection/_focus_playbook.html", focus_playbook_context))


def _on_burst_closed(burst: Any) -> None:
    """Reflect on the closed burst: its chain is sent once the closing transaction commits."""
    from reflection.tasks import reflection_chain

    burst_id = burst.pk

    def send() -> None:
        try:
            reflection_chain(burst_id).apply_async()
        except Exception:  # a broker outage must not fail the wave
            logger.exception("reflection of burst %s could not be sent", burst_id)

    transaction.on_commit(send)
