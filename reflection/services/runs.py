"""The only writer of ReflectionRun: starting a reflection over a burst and moving it through
its stages, each move a compare-and-set on the status it comes from."""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from reflection.errors import IllegalTransition, NotFound
from reflection.models import (
    REFLECTION_RUN_TERMINAL,
    REFLECTION_RUN_TRANSITIONS,
    ReflectionRun,
)

logger = logging.getLogger(__name__)


def reflection_run_start(burst_id: int) -> tuple[ReflectionRun, bool]:
    """The burst's reflection run, created (status started) if it has none; `created` says
    which. Two callers racing on one burst get the same row (the burst is unique)."""
    from bursts.models import Burst

    wave_id = Burst.objects.filter(pk=burst_id).values_list("wave_id", flat=True).first()
    if wave_id is None:
        raise NotFound(f"no burst #{burst_id}")
    try:
        with transaction.atomic():
            run, created = ReflectionRun.objects.get_or_create(
                burst_id=burst_id, defaults={"wave_id": wave_id}
            )
    except IntegrityError:
        # Another caller inserted between our read and our insert: theirs is the run.
        run, created = ReflectionRun.objects.get(burst_id=burst_id), False
    if created:
        logger.info(
            "reflection %s started on burst %s",
            run.pk,
            burst_id,
            extra={"reflection_run_id": run.pk, "burst_id": burst_id},
        )
    return run, created


def reflection_run_transition(run_id: int, to: str, **fields: Any) -> ReflectionRun:
    """Move the run to `to` from its current status if REFLECTION_RUN_TRANSITIONS allows it
    (compare-and-set: a concurrent move in between makes this one fail); `fields` are written
    in the same UPDATE. A terminal status stamps finished_at. IllegalTransition otherwise."""
    current = ReflectionRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if current is None:
        raise NotFound(f"no reflection run #{run_id}")
    if to not in REFLECTION_RUN_TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"cannot move reflection run #{run_id} from {current} to {to}")
    now = timezone.now()
    if to in REFLECTION_RUN_TERMINAL:
        fields.setdefault("finished_at", now)
    updated = ReflectionRun.objects.filter(pk=run_id, status=current).update(
        status=to, updated_at=now, **fields
    )
    if updated != 1:
        raise IllegalTransition(
            f"cannot move reflection run #{run_id} to {to}: it left {current} meanwhile"
        )
    logger.info(
        "reflection %s: %s -> %s",
        run_id,
        current,
        to,
        extra={"reflection_run_id": run_id, "from_status": current, "to_status": to},
    )
    return ReflectionRun.objects.get(pk=run_id)
