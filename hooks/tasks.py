"""Celery tasks of the hooks app: thin adapters over its services."""

from __future__ import annotations

from typing import Any

from celery import shared_task

import core.celery  # noqa: F401  (its shared_tasks are bound to the project's application)


@shared_task(name="hooks.outbox", ignore_result=True)
def outbox() -> dict[str, Any]:
    """The beat's pass: record the deliveries of new events, send again those whose task was
    lost."""
    from hooks.services.outgoing import deliveries_resend_due, outbox_scan

    scan = outbox_scan()
    resent = deliveries_resend_due()
    return {"read": scan.read, "created": len(scan.created), "resent": len(resent)}


@shared_task(name="hooks.deliver", bind=True, ignore_result=True, max_retries=None)
def deliver(self: Any, delivery_id: int) -> str:
    """One attempt of a delivery; a failure is retried by Celery after the delivery's backoff
    (the row counts the attempts and stops them; the task retries without a limit of its own).
    Idempotent: a delivery finished or held by another task is left alone."""
    from hooks.services.outgoing import delivery_attempt

    result = delivery_attempt(delivery_id=delivery_id)
    if result.retry_in_s is not None:
        raise self.retry(countdown=result.retry_in_s)
    return result.status
