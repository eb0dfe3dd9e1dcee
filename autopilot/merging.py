"""Which of the autopilot's changes merge without the operator."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from autopilot.labels import AUTOPILOT


def autopilot_auto_merge(labels: Sequence[str]) -> bool:
    """A low-risk change of a quantum the autopilot filed merges on its own when the setting
    allows (tether.hooks.AUTO_MERGE_POLICIES)."""
    return bool(settings.AUTOPILOT_AUTO_MERGE_LOW_RISK) and AUTOPILOT in labels
