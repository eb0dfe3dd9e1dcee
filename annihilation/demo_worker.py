"""A Celery worker for the length of one command (the demo), unless one is already running."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from annihilation.celery import app

logger = logging.getLogger(__name__)


ALREADY_RUNNING = "an already running worker"


def workers_running() -> bool:
    return bool(app.control.ping(timeout=0.5))


@contextmanager
def worker_for_command(
    *, env: dict[str, str] | None = None, ready_timeout: float = 60
) -> Iterator[str]:
    """Yield a description of the worker serving this command: one already running, or one
    started here (threads pool, embedded beat for the safety net) and stopped on the way out."""
    if workers_running():
        yield ALREADY_RUNNING
        return
    home = Path(settings.ANNIHILATION_HOME)
    home.mkdir(parents=True, exist_ok=True)
    log = home / "demo-worker.log"
    command = [
        sys.executable, "-m", "celery", "-A", "annihilation", "worker",
        "-P", "threads", "-c", "16", "-B", "-s", str(home / "celerybeat-schedule"),
        "-n", f"demo-{os.getpid()}@%h", "--without-mingle", "--without-gossip",
        "-l", "info", "--logfile", str(log),
    ]  # fmt: skip
    with log.open("ab") as output:
        proc = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            cwd=settings.BASE_DIR,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + ready_timeout
        while not workers_running():
            if proc.poll() is not None:
                raise RuntimeError(f"the Celery worker exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Celery worker did not answer within {ready_timeout} s; see {log}"
                )
        yield f"a worker started for this command (log: {log})"
    finally:
        proc.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
