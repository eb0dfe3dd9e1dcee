"""Celery tasks: thin adapters that take ids and call the services (all idempotent)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from core.celery import app
from tether.services import change_review_create, mutation_expire, reaching_expire, tether_sweep
from tether.services.changes import QUEUE_TASK, REVIEW_TASK, changes_queued
from tether.services.merge_queue import merge_queue_run

logger = logging.getLogger(__name__)


@shared_task(name="tether.reaching_expire", acks_late=True, ignore_result=True)
def reaching_expire_task(reaching_id: int) -> bool:
    """The reaching's own timer (countdown = its timeout); a no-op once it is resolved."""
    return reaching_expire(reaching_id=reaching_id)


@shared_task(name="tether.mutation_expire", acks_late=True, ignore_result=True)
def mutation_expire_task(mutation_id: int) -> bool:
    return mutation_expire(mutation_id=mutation_id)


@shared_task(
    name=REVIEW_TASK,
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=3,
)
def change_review_create_task(quantum_run_id: int) -> int | None:
    review = change_review_create(quantum_run_id=quantum_run_id)
    return review.pk if review else None


@shared_task(name=QUEUE_TASK, acks_late=True, ignore_result=True)
def merge_queue_run_task() -> dict[str, Any]:
    """The merge queue's consumer: a no-op while another one runs (it takes the queue's lock
    without waiting). Redelivered after a crash it resumes the entry left merging."""
    report = merge_queue_run()
    if not report.busy:
        logger.info("merge queue: %s", report)
    return vars(report)


@shared_task(name="tether.sweep", ignore_result=True)
def tether_sweep_task() -> dict[str, Any]:
    report = tether_sweep()
    if changes_queued():
        # A kick lost with a dead worker or an entry left blocked: the queue goes on.
        app.send_task(QUEUE_TASK)
    if (
        report.expired
        or report.mutations_expired
        or report.woken
        or report.queue_rebuilt
        or report.reviews_resent
    ):
        logger.info("tether sweep: %s", report)
    return vars(report)
