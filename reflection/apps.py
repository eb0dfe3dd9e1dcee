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
        from bursts.hooks import ON_RUN_DRAINED
        from psychonauts.services.prompt import PROMPT_SECTIONS
        from reflection.services.injection import on_run_drained, playbook_section

        if playbook_section not in PROMPT_SECTIONS:
            PROMPT_SECTIONS.append(playbook_section)
        if on_run_drained not in ON_RUN_DRAINED:
            ON_RUN_DRAINED.append(on_run_drained)
        from bursts.hooks import ON_BURST_CLOSED

        if _on_burst_closed not in ON_BURST_CLOSED:
            ON_BURST_CLOSED.append(_on_burst_closed)

        from reflection.views import grounding_deltas_context
        from tether.views.sections import GroundingSection, grounding_section_register

        grounding_section_register(
            GroundingSection("reflection/_grounding_deltas.html", grounding_deltas_context)
        )


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
