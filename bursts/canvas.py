"""Sending a stage to Celery: a sequential stage is a chain, a fan-out stage is a chord.

Signatures are built by task name, so the services that call this never import the tasks.

    sequential: stage_agent(None, run, k, 0) | stage_agent(run, k, 1) | ... (last one evaluates)
    fan_out:    chord([stage_agent(None, run, k, p) for p], stage_done(run, k))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from celery import chain, chord, group
from celery.canvas import Signature
from django.db import transaction

from annihilation.celery import app
from quanta.pipeline_models import StageMode

logger = logging.getLogger(__name__)

STAGE_AGENT = "bursts.stage_agent"
STAGE_DONE = "bursts.stage_done"


@dataclass(frozen=True)
class StageDispatch:
    quantum_run_id: int
    stage_index: int
    mode: str
    positions: tuple[int, ...]


def stage_canvas(d: StageDispatch) -> Signature:
    run, k = d.quantum_run_id, d.stage_index
    if d.mode == StageMode.FAN_OUT:
        header = [
            app.signature(STAGE_AGENT, args=(None, run, k, p, False), immutable=True)
            for p in d.positions
        ]
        return chord(group(header), app.signature(STAGE_DONE, args=(run, k), immutable=True))
    last = len(d.positions) - 1
    links: list[Signature] = [
        app.signature(STAGE_AGENT, args=(None, run, k, d.positions[0], last == 0), immutable=True)
    ]
    # Each later link receives the previous link's SlotResult as its first argument.
    links += [
        app.signature(STAGE_AGENT, args=(run, k, p, n == last))
        for n, p in enumerate(d.positions[1:], start=1)
    ]
    return links[0] if len(links) == 1 else chain(*links)


def stages_send_unsafe(dispatches: Sequence[StageDispatch]) -> None:
    """Send now (hence `unsafe`: only after commit). A broker outage is logged, not raised:
    the rows say the stage was dispatched, and the safety net sends it again after the grace."""
    for d in dispatches:
        try:
            stage_canvas(d).apply_async()
        except Exception:
            logger.warning(
                "could not send stage %s of run %s to Celery; the safety net will retry",
                d.stage_index,
                d.quantum_run_id,
                exc_info=True,
            )


def stages_send(dispatches: Sequence[StageDispatch]) -> None:
    """Send the stages once the current transaction commits (workers must see the rows)."""
    if dispatches:
        items = list(dispatches)
        transaction.on_commit(lambda: stages_send_unsafe(items))
