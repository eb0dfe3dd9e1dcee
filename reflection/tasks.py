"""Celery tasks of reflection: thin adapters over its services."""

from __future__ import annotations

from typing import Any

from celery import chain, shared_task


@shared_task(name="reflection.decay", ignore_result=True)
def decay() -> int:
    """The beat's sweep: decay every live rule's confidence to now (idempotent: a second run
    decays only the time since the first)."""
    from reflection.services.playbook import rules_decay

    return rules_decay()


@shared_task(name="reflection.start", ignore_result=True)
def reflection_start(burst_id: int) -> int | None:
    """The first link of the chain: the run to carry on, None when the burst was reflected."""
    from reflection import pipeline

    return pipeline.start(burst_id)


@shared_task(name="reflection.stage", ignore_result=True)
def reflection_stage(run_id: int | None, stage: str) -> int | None:
    """One stage of the pipeline (a no-op on None: an earlier stage ended the run)."""
    from reflection import pipeline

    return {s.__name__: s for s in pipeline.STAGES}[stage](run_id)


def reflection_chain(burst_id: int) -> Any:
    """The Celery chain over one burst, one task per stage."""
    from reflection import pipeline

    return chain(
        reflection_start.s(burst_id),
        *(reflection_stage.s(stage.__name__) for stage in pipeline.STAGES),
    )
