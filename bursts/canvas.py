"""Sending a stage to Celery: a sequential stage is a chain, a fan-out stage is a chord.

Signatures are built by task name, so the services that call this never import the tasks.

    sequential: stage_agent(None, run, k, 0, ..) | stage_agent(run, k, 1, ..) | ... (last evaluates)
    fan_out:    chord([stage_agent(None, run, k, p, ..) for p], stage_done(run, k))

A dispatch that knows the AgentRun ids it just created passes them along: the task then starts
its agent in one statement instead of looking the slot up (the fast path of `slot_run`).
Sequential links store no result (the chain hands each return value to the next link in the
message); chord headers must, for the join.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from celery import chain, chord, group
from celery.canvas import Signature
from django.db import transaction

from core.celery import app
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
    # The first attempt's AgentRun id per position, when the dispatcher just created them, and
    # the Celery task id recorded on each (so that cancelling the wave can revoke them).
    agent_run_ids: tuple[int, ...] = ()
    task_ids: tuple[str, ...] = ()


def stage_canvas(d: StageDispatch) -> Signature:
    run, k = d.quantum_run_id, d.stage_index
    ids: list[int | None] = list(d.agent_run_ids) or [None] * len(d.positions)
    # No recorded id: Celery makes one up.
    opts: list[dict[str, str]] = [{"task_id": t} for t in d.task_ids] or [{}] * len(d.positions)
    if d.mode == StageMode.FAN_OUT:
        header = [
            app.signature(STAGE_AGENT, args=(None, run, k, p, False, i), immutable=True, **o)
            for p, i, o in zip(d.positions, ids, opts, strict=True)
        ]
        return chord(
            group(header),
            app.signature(STAGE_DONE, args=(run, k), immutable=True, ignore_result=True),
        )
    last = len(d.positions) - 1
    links: list[Signature] = [
        app.signature(
            STAGE_AGENT,
            args=(None, run, k, d.positions[0], last == 0, ids[0]),
            immutable=True,
            ignore_result=True,
            **opts[0],
        )
    ]
    # Each later link receives the previous link's SlotResult as its first argument.
    links += [
        app.signature(STAGE_AGENT, args=(run, k, p, n == last, i), ignore_result=True, **o)
        for n, (p, i, o) in enumerate(zip(d.positions[1:], ids[1:], opts[1:], strict=True), start=1)
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
        transaction.on_commit(lambda: _send_or_keep(items))


_in_place = threading.local()


@contextmanager
def stage_in_place(quantum_run_id: int) -> Iterator[list[StageDispatch]]:
    """Within the block, a later stage of this run that is one sequential agent, once its
    rows commit, is handed back instead of sent: a fan-out stage's chord callback runs it in
    place, as the chord body of the raw Celery DAG would, instead of sending a message to a
    worker to run one task. Nothing is lost if the worker dies there: the agent row is pending
    (or running with a lapsing lease), and the safety net sends it again after the grace."""
    kept: list[StageDispatch] = []
    _in_place.slot = (quantum_run_id, kept)
    try:
        yield kept
    finally:
        _in_place.slot = None


def _send_or_keep(items: list[StageDispatch]) -> None:
    slot: tuple[int, list[StageDispatch]] | None = getattr(_in_place, "slot", None)
    if slot is not None and not slot[1] and len(items) == 1:
        d = items[0]
        if (
            d.quantum_run_id == slot[0]
            and d.mode == StageMode.SEQUENTIAL
            and len(d.positions) == 1
            and d.agent_run_ids
        ):
            slot[1].append(d)
            return
    stages_send_unsafe(items)


def tasks_revoke_unsafe(task_ids: Sequence[str]) -> None:
    """Tell the workers to drop these queued tasks (one broadcast). Best effort: a worker that
    is down misses it, and a task that runs anyway finds its agent cancelled and returns."""
    if not task_ids:
        return
    try:
        app.control.revoke(list(task_ids))
    except Exception:
        logger.warning("could not revoke %s queued stage tasks", len(task_ids), exc_info=True)
