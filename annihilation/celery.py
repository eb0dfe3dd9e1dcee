"""The Celery application. Workers: `celery -A annihilation worker`."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun
from django.db import connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")

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
