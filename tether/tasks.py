"""Celery tasks: thin adapters that take ids and call the services (all idempotent)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from tether.services import change_review_create, mutation_expire, reaching_expire, tether_sweep

logger = logging.getLogger(__name__)


@shared_task(name="tether.reaching_expire", acks_late=True, ignore_result=True)
def reaching_expire_task(reaching_id: int) -> bool:
    """The reaching's own timer (countdown = its timeout); a no-op once it is resolved."""
    return reaching_expire(reaching_id=reaching_id)


@shared_task(name="tether.mutation_expire", acks_late=True, ignore_result=True)
def mutation_expire_task(mutation_id: int) -> bool:
    return mutation_expire(mutation_id=mutation_id)


@shared_task(
    name="tether.change_review_create",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=3,
)
def change_review_create_task(quantum_run_id: int) -> int | None:
    review = change_review_create(quantum_run_id=quantum_run_id)
    return review.pk if review else None


@shared_task(name="tether.sweep", ignore_result=True)
def tether_sweep_task() -> dict[str, Any]:
    report = tether_sweep()
    if report.expired or report.mutations_expired or report.woken or report.queue_rebuilt:
        logger.info("tether sweep: %s", report)
    return vars(report)
