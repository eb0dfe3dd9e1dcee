"""The no_worker rule, evaluated in the beat process.

The alerter's tick is a Celery task: with no worker at all, nobody runs it, and the one rule
that matters then would never fire. The beat sends tasks without consuming any, so it lives on
when every worker is gone: a thread of its own asks the workers every OPERATIONS_TICK_S and
fires (or resolves) `no_worker` itself. Started by Celery's `beat_init` signal
(operations.apps); a worker with an embedded beat (`-B`) runs it too, harmlessly (it answers
its own ping, and the alert is a compare-and-set).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)

_started = threading.Event()


def _loop() -> None:
    from operations.services import no_worker_check

    while True:
        time.sleep(settings.OPERATIONS_TICK_S)
        close_old_connections()
        try:
            no_worker_check()
        except Exception:  # a database or broker hiccup: the next round tries again
            logger.warning("the no-worker check failed", exc_info=True)
        finally:
            connection.close()


def watchdog_start(**_: Any) -> None:
    """Start the watching thread once per process."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=_loop, name="no-worker-watchdog", daemon=True).start()
