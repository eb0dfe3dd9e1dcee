from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def _task_failed(**_: Any) -> None:
    from core import metrics

    metrics.error("task")


class OperationsConfig(AppConfig):
    """Running the system: metrics, alerts, outgoing webhooks and structured logs."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import beat_init, task_failure

        from operations.watchdog import watchdog_start

        # A failed Celery task in any worker counts as an error of kind `task`.
        task_failure.connect(_task_failed, weak=False, dispatch_uid="operations.task_failed")
        # The beat process fires `no_worker` itself: with no worker, no task would.
        beat_init.connect(watchdog_start, weak=False, dispatch_uid="operations.watchdog")
