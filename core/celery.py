"""The Celery application every app sends its tasks with; its configuration is the Django
settings' CELERY_* names. Workers start it as `celery -A annihilation worker`."""

from __future__ import annotations

import gc
from typing import Any

from celery import Celery
from celery.signals import task_postrun, worker_init, worker_process_init
from django.db import connections

from core import workers  # noqa: F401  (its receivers note each worker's host in Redis)

app = Celery("annihilation")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_postrun.connect
def _drop_broken_connections(**_: Any) -> None:
    """Workers reuse their database connection across tasks (CELERY_DB_REUSE_MAX); one that
    saw an error and no longer answers (Postgres restarted) is closed so the next task opens a
    fresh one instead of failing. Django's own check would also close a healthy one (max age 0)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


# A threads worker runs a hundred agents in one process: every collection holds the GIL for
# all of them. Python's default (700, 10, 10) ran ~600 young and 5 full collections per 200
# agents of bench/agents_concurrency.py, 0.76 s of CPU (the full ones ~0.1 s each); these
# thresholds ran 20 young ones, 0.10 s. Garbage in cycles is still collected, later.
WORKER_GC_THRESHOLDS = (20_000, 20, 20)


@worker_init.connect
@worker_process_init.connect
def _fewer_collections(**_: Any) -> None:
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
