"""Celery tasks: thin adapters that take ids and call the services (all idempotent)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from forges.errors import ForgeUnavailable
from forges.services import (
    PUBLISH_TASK,
    SYNC_TASK,
    pull_request_publish,
    pull_request_sync,
    pull_requests_due,
)


def _countdown(task: Any, exc: ForgeUnavailable) -> float:
    """Exponential backoff, at least what the forge asked for."""
    backoff = settings.FORGES_BACKOFF_S * 10 * 2 ** int(task.request.retries)
    return float(min(max(backoff, exc.retry_after_s), 3600.0))


@shared_task(bind=True, name=PUBLISH_TASK, acks_late=True, ignore_result=True, max_retries=8)
def pull_request_publish_task(self: Any, pull_id: int) -> None:
    try:
        pull_request_publish(pull_id=pull_id)
    except ForgeUnavailable as exc:
        raise self.retry(countdown=_countdown(self, exc)) from None


@shared_task(bind=True, name=SYNC_TASK, acks_late=True, ignore_result=True, max_retries=8)
def pull_request_sync_task(self: Any, pull_id: int) -> None:
    try:
        pull_request_sync(pull_id=pull_id)
    except ForgeUnavailable as exc:
        raise self.retry(countdown=_countdown(self, exc)) from None


@shared_task(name="forges.poll", ignore_result=True)
def pull_requests_poll_task() -> None:
    pull_requests_due()
