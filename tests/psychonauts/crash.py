"""Killing an agent run mid-way: `manage.py psychonaut execute` in a process of its own, killed
(with everything it started) once its script has touched `marker` in the worktree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from bursts.models import AgentRun


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def execute_killed_at_marker(run: AgentRun, *, repo: Path, tmp_path: Path) -> Path:
    """Run `run` in a worker process of its own until the marker appears, then SIGKILL its
    process group. Returns the run's worktree (under `tmp_path / "home"`)."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "ANNIHILATION_HOME": str(tmp_path / "home"),
        "ANNIHILATION_REPO": str(repo),
        "ANNIHILATION_SCRIPT_DIRS": str(tmp_path / "scripts"),
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "psychonaut", "execute", str(run.pk)],
        cwd=Path(settings.BASE_DIR),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worktree = tmp_path / "home" / "worktrees" / f"q-{run.quantum_id}"
    try:
        wait_for(lambda: (worktree / "marker").exists())
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and its shell, mid tool call
        worker.wait()
    return worktree
