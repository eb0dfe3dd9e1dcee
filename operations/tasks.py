"""The alerter's beat task (CELERY_BEAT_SCHEDULE: operations-tick)."""

from __future__ import annotations

from celery import shared_task

import core.celery  # noqa: F401  (its shared_tasks are bound to the project's application)
from operations.services import operations_tick


@shared_task(name="operations.tick", ignore_result=True)
def tick() -> None:
    operations_tick()
