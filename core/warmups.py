"""The hook of a threads worker's warm-ups (run by `core.celery` when a worker starts). Kept
apart from the Celery application so that an app registers its own from its hooks.py without
every process (commands, the web) loading Celery's application to do so."""

from __future__ import annotations

from collections.abc import Callable

from core.hooks import Hook

# f(concurrency): run when a threads worker starts, before its first task.
WorkerWarmup = Callable[[int], object]
WARMUPS: Hook[WorkerWarmup] = Hook("core.worker_warmups")
