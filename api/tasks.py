"""The api app's beat task: forget idempotent responses past their retention."""

from __future__ import annotations

from celery import shared_task

import core.celery  # noqa: F401  (its shared_tasks are bound to the project's application)
from api.services import idempotency_purge


@shared_task(name="api.idempotency_purge", ignore_result=True)
def purge_idempotency_keys() -> int:
    """Idempotent: a second run finds nothing older than the retention."""
    return idempotency_purge()
