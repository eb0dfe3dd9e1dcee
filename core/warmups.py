"""The registry of a threads worker's warm-ups (run by `core.celery` when a worker starts). Kept
apart from the Celery application so that an app registers its own in AppConfig.ready without
every process (commands, the web) loading Celery's application to do so."""

from __future__ import annotations

from collections.abc import Callable

WorkerWarmup = Callable[[int], object]
WARMUPS: list[WorkerWarmup] = []


def worker_warmup_register(warmup: WorkerWarmup) -> None:
    """Have `warmup(concurrency)` run when a threads worker starts, before its first task (an
    upper app registers its own in AppConfig.ready)."""
    if warmup not in WARMUPS:
        WARMUPS.append(warmup)
