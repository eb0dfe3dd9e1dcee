"""Where operations plugs into the processes it watches, and nowhere else: imported by
`OperationsConfig.ready()`."""

from __future__ import annotations

from typing import Any

from celery.signals import beat_init, task_failure

from core import metrics
from operations.watchdog import watchdog_start


def task_failed(**_: Any) -> None:
    """A failed Celery task in any worker counts as an error of kind `task`."""
    metrics.error("task")


task_failure.connect(task_failed, weak=False, dispatch_uid="operations.task_failed")
# The beat process fires `no_worker` itself: with no worker, no task would.
beat_init.connect(watchdog_start, weak=False, dispatch_uid="operations.watchdog")
