"""Traumas: command patterns that caused an incident, which the guard escalates one tier.

The operator enters them by hand (admin); they apply to every quantum unless they name one. The
runtime records one on its own when the guard refuses a dangerous command or when a command runs
into a limit the runtime itself measured (never from what the command printed: an agent controls
its output, and a file named `MemoryError` listed by `ls` must not make `ls` an incident). A
recorded trauma applies to its agent's quantum only, so one agent cannot change what the others
may run; the operator confirms it to make it apply to every quantum.
"""

from __future__ import annotations

import logging
import re

from django.db.models import F, Q
from django.utils import timezone

from core.redaction import redact
from psychonauts.errors import PsychonautError
from psychonauts.models import CommandTrauma, TraumaSource

logger = logging.getLogger(__name__)

PATTERN_MAX = CommandTrauma._meta.get_field("pattern").max_length or 300


class TraumaNotFound(PsychonautError):
    """No trauma with that id."""


def trauma_pattern(command: str) -> str:
    """The pattern a recorded trauma keeps for `command`: that command exactly, not every
    command it is part of (`ls` must not match `false`)."""
    return rf"^{re.escape(command.strip())}$"


def trauma_record(
    *, pattern: str, reason: str, source: str, agent_id: str, quantum_id: int
) -> CommandTrauma:
    """Record (or count again) an incident for `pattern`, a regular expression, for the
    agent's quantum only."""
    # A command can carry a secret: stored redacted, like everything else an agent wrote.
    pattern, reason = redact(pattern)[:PATTERN_MAX], redact(reason)
    if pattern.endswith("\\") and not pattern.endswith("\\\\"):
        pattern = pattern[:-1]  # a cut escape would not compile
    now = timezone.now()
    same = CommandTrauma.objects.filter(pattern=pattern, source=source, quantum_id=quantum_id)
    updated = same.update(hits=F("hits") + 1, last_seen_at=now, reason=reason, agent_id=agent_id)
    if updated:
        trauma = same.first()
        assert trauma is not None
    else:
        trauma = CommandTrauma.objects.create(
            pattern=pattern, reason=reason, source=TraumaSource(source), agent_id=agent_id,
            quantum_id=quantum_id, last_seen_at=now,
        )  # fmt: skip
    logger.warning(
        "trauma recorded: %s (%s)", reason, agent_id,
        extra={"trauma_id": trauma.pk, "agent_id": agent_id, "source": source,
               "quantum_id": quantum_id},
    )  # fmt: skip
    return trauma


def trauma_apply_everywhere(*, trauma_id: int, operator: str) -> CommandTrauma:
    """The operator confirms a trauma: from now on it applies to every quantum."""
    updated = CommandTrauma.objects.filter(pk=trauma_id).update(
        quantum_id=None, active=True, confirmed_by=operator, confirmed_at=timezone.now()
    )
    if updated != 1:
        raise TraumaNotFound(f"no trauma {trauma_id}")
    logger.warning(
        "trauma applies to every quantum: %s", trauma_id,
        extra={"trauma_id": trauma_id, "operator": operator},
    )  # fmt: skip
    return CommandTrauma.objects.get(pk=trauma_id)


def traumas_for(*, quantum_id: int | None) -> list[tuple[str, str]]:
    """The (pattern, reason) pairs the guard applies to a command of `quantum_id`'s agents:
    the global ones and that quantum's own."""
    scope = Q(quantum_id__isnull=True)
    if quantum_id is not None:
        scope |= Q(quantum_id=quantum_id)
    # A loop's trauma names a repeated call, not a command pattern (psychonauts/runtime/loops.py).
    commands = CommandTrauma.objects.filter(scope, active=True).exclude(source=TraumaSource.LOOP)
    return list(commands.values_list("pattern", "reason"))
