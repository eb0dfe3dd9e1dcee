"""Traumas: command patterns that caused an incident, which the guard escalates one tier.

The operator enters them by hand (admin); the runtime records one on its own when the guard
refuses a dangerous command or a command runs into a sandbox boundary.
"""

from __future__ import annotations

import logging

from django.db.models import F
from django.utils import timezone

from core.redaction import redact
from psychonauts.models import CommandTrauma, TraumaSource

logger = logging.getLogger(__name__)

PATTERN_MAX = CommandTrauma._meta.get_field("pattern").max_length or 300


def trauma_record(*, pattern: str, reason: str, source: str, agent_id: str) -> CommandTrauma:
    """Record (or count again) an incident for `pattern`, a regular expression."""
    # A command can carry a secret: stored redacted, like everything else an agent wrote.
    pattern, reason = redact(pattern)[:PATTERN_MAX], redact(reason)
    if pattern.endswith("\\") and not pattern.endswith("\\\\"):
        pattern = pattern[:-1]  # a cut escape would not compile
    now = timezone.now()
    updated = CommandTrauma.objects.filter(pattern=pattern, source=source).update(
        hits=F("hits") + 1, last_seen_at=now, reason=reason, agent_id=agent_id
    )
    if updated:
        trauma = CommandTrauma.objects.filter(pattern=pattern, source=source).first()
        assert trauma is not None
    else:
        trauma = CommandTrauma.objects.create(
            pattern=pattern, reason=reason, source=TraumaSource(source), agent_id=agent_id,
            last_seen_at=now,
        )  # fmt: skip
    logger.warning(
        "trauma recorded: %s (%s)", reason, agent_id,
        extra={"trauma_id": trauma.pk, "agent_id": agent_id, "source": source},
    )  # fmt: skip
    return trauma
