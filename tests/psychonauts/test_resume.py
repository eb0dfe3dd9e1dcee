"""A run killed mid-way resumes from its checkpoint and never repeats a completed tool call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from bursts.models import AgentStatus
from psychonauts.models import AgentTurn, ToolCall
from psychonauts.services import agent_run_execute

pytestmark = pytest.mark.django_db(transaction=True)

CRASHY = """
name: crashy
match: {labels: [crashy]}
turns:
  - tools:
      - shell: {command: "echo once >> counter.txt"}
  - tools:
      - shell: {command: "test -f marker || (touch marker && sleep 60)"}
  - text: "finished"
"""


def _wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def test_it_resumes_after_a_kill_without_repeating_a_completed_tool_call(
    repo, scripts, make_quantum, make_run, tmp_path, settings
):
    scripts("crashy", CRASHY)
    run = make_run("coder", quantum=make_quantum(labels=["crashy"]))
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": django_settings.REDIS_URL,
        "ANNIHILATION_HOME": str(tmp_path / "home"),
        "ANNIHILATION_REPO": str(repo),
        "ANNIHILATION_SCRIPT_DIRS": str(tmp_path / "scripts"),
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "psychonaut", "execute", str(run.pk)],
        cwd=Path(django_settings.BASE_DIR),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worktree = tmp_path / "home" / "worktrees" / f"q-{run.quantum_id}"
    try:
        _wait_for(lambda: (worktree / "marker").exists())
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # the worker and its shell, mid tool call
        worker.wait()
    run.refresh_from_db()
    assert run.status == AgentStatus.RUNNING
    assert ToolCall.objects.filter(agent_run=run, completed=True).count() == 1

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert (worktree / "counter.txt").read_text() == "once\n"
    assert ToolCall.objects.filter(agent_run=run).count() == 2
    assert list(AgentTurn.objects.filter(agent_run=run).values_list("index", flat=True)) == [
        0,
        1,
        2,
    ]
