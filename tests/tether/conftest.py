"""Fixtures for the Tether: a real git repository, scripted agents and a real Celery worker.

The worker runs the agent runtime (`psychonauts` executor) on the test database, with the test's
repository, scripts and a fast tether sweep (beat), so timeouts, resumes and lost timers happen
within a test's patience. Tests that use it are `transaction=True`: the worker sees commits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.conf import settings as django_settings
from django.db import connection

from bursts.models import AgentRun
from tests.bursts.conftest import Worker, worker_env
from tests.psychonauts.conftest import make_quantum, make_run, scripts

__all__ = ["make_quantum", "make_run", "scripts"]

SWEEP_S = "0.3"

# A pipeline an agent proposes in the mutation tests: the `solo` one with a tester added.
SOLO_WITH_TESTER = """name: solo
match:
  labels: [solo]
stages:
  - name: implement
    agents: [coder]
  - name: check
    agents: [tester]
"""


def agent_status(run_id: int) -> str:
    return str(AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first())


@pytest.fixture
def tether_settings(repo: Path, settings: Any, tmp_path: Path) -> Any:
    settings.BURSTS_EXECUTOR = "psychonauts"
    settings.TETHER_SWEEP_INTERVAL_S = float(SWEEP_S)
    settings.TETHER_AUTO_MERGE_LOW_RISK = False
    settings.TETHER_TARGET_BRANCH = ""
    return settings


@pytest.fixture
def tether_worker(
    tether_settings: Any, repo: Path, scripts: Callable[[str, str], None], tmp_path: Path
) -> Iterator[Worker]:
    """A threads worker (4 slots, beat embedded) for one test, on the test's repository."""
    env = worker_env(
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(tmp_path / "home"),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(tmp_path / "scripts"),
        ANNIHILATION_PROVIDER="",
        ANNIHILATION_TETHER_SWEEP_INTERVAL_S=SWEEP_S,
        ANNIHILATION_TEXT_FLUSH_S="0",
        REDIS_URL=django_settings.REDIS_URL,
    )
    worker = Worker(env=env, tmp=tmp_path, name=f"tether-{os.getpid()}", beat=True).start()
    yield worker
    worker.stop()
    connection.close()


# The tasks that run one agent outside a stage: started (psychonauts), resumed (bursts).
AGENT_TASKS = ("psychonauts.tasks.execute_agent_run", "bursts.agent_execute")


def active_tasks(worker: Worker, names: tuple[str, ...] = AGENT_TASKS) -> int:
    """Agent tasks the worker is executing right now (the slots agents occupy; the embedded
    beat's sweeps come and go and are not counted)."""
    with Celery(broker=worker.env["REDIS_URL"]) as probe:
        replies = probe.control.inspect(
            destination=[f"{worker.name}@{os.uname().nodename}"], timeout=1.0
        ).active()
    assert replies, "the worker did not answer"
    return sum(1 for tasks in replies.values() for task in tasks if task.get("name") in names)
