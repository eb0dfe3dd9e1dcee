"""Contemplating: a contemplator agent on a real worker proposes goals through `propose_goal`;
they wait for the operator, never approved on their own; one contemplation at a time."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from autopilot.labels import filed_labels
from autopilot.models import Goal, GoalSource, GoalStatus
from autopilot.services.contemplation import (
    ANCHOR_TITLE,
    contemplate_start,
    contemplation_context,
    contemplations_start,
)
from autopilot.services.goals.lifecycle import goal_create
from bursts.models import AGENT_TERMINAL, AgentRun
from core.celery import app
from core.models import Event
from psychonauts.workspaces.git import git
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum
from quanta.services import quantum_create, quantum_reopen
from repos.services import repository_create, repository_default
from tests.bursts.conftest import ROOT, Worker, worker_env

SCRIPT = ROOT / "psychonauts" / "scripts" / "contemplate-demo.yaml"


@pytest.fixture
def contemplation_settings(settings: Any, repo: Path) -> Any:
    settings.AUTOPILOT_PROPOSALS_MAX = 5
    settings.TETHER_TARGET_BRANCH = ""
    return settings


@pytest.fixture
def worker(contemplation_settings: Any, repo: Path, tmp_path: Path) -> Iterator[Worker]:
    """A threads worker on the test's repository, with the contemplation script only."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(SCRIPT, scripts / SCRIPT.name)
    env = worker_env(
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(tmp_path / "home"),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
        ANNIHILATION_PROVIDER="",
        ANNIHILATION_TEXT_FLUSH_S="0",
        REDIS_URL=django_settings.REDIS_URL,
    )
    w = Worker(env=env, tmp=tmp_path, name=f"contemplate-{os.getpid()}", beat=False).start()
    yield w
    w.stop()
    connection.close()


def wait_run(run_id: int, timeout: float = 30) -> AgentRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = AgentRun.objects.get(pk=run_id)
        if run.status in AGENT_TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"agent run {run_id} still {run.status} after {timeout} s")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_contemplator_proposes_goals_that_wait_for_the_operator(worker: Worker) -> None:
    run = contemplate_start()
    assert run is not None and run.role == "contemplator"
    anchor = Quantum.objects.get(pk=run.quantum_id)
    assert anchor.status == "deferred" and anchor.kind == "chore"
    assert anchor.labels == filed_labels("contemplating")
    assert "Propose at most 5 goals" in run.context
    done = wait_run(run.pk)
    assert done.status == "done", (done.error, worker.log.read_text()[-3000:])
    goals = list(Goal.objects.order_by("pk"))
    assert [g.title for g in goals] == [
        "Cover the calculator's edge cases with tests",
        "Document how to run the project",
    ]
    assert {g.source for g in goals} == {GoalSource.CONTEMPLATION}
    assert goals[0].verify_commands == ["python3 -m pytest -q"]
    # Never approved on their own: once the worker has nothing left to do, they still wait.
    worker.wait_idle(required=True)
    assert set(Goal.objects.values_list("status", flat=True)) == {GoalStatus.PROPOSED}
    assert not Goal.objects.exclude(approved_by="").exists()
    (started,) = Event.objects.filter(topic="autopilot:contemplation", type="started")
    assert started.payload["agent_run_id"] == run.pk
    # The next contemplation reuses the anchor, knows the proposals and has less room.
    again = contemplate_start()
    assert again is not None and again.quantum_id == anchor.pk
    assert "Propose at most 3 goals" in again.context
    assert "Cover the calculator's edge cases with tests" in again.context
    wait_run(again.pk)
    assert Quantum.objects.filter(title=ANCHOR_TITLE).count() == 1


@pytest.mark.django_db
def test_no_contemplation_while_one_runs(contemplation_settings: Any) -> None:
    # No worker (nothing is sent before commit here): the first run stays pending.
    first = contemplate_start()
    assert first is not None and first.status == "pending"
    assert contemplate_start() is None
    AgentRun.objects.filter(pk=first.pk).update(status="done")
    quantum_reopen(quantum_id=first.quantum_id)  # by hand: the next start defers it again
    second = contemplate_start()
    assert second is not None and second.quantum_id == first.quantum_id
    assert Quantum.objects.get(pk=first.quantum_id).status == "deferred"


@pytest.mark.django_db
def test_no_contemplation_while_enough_proposals_wait(contemplation_settings: Any) -> None:
    contemplation_settings.AUTOPILOT_PROPOSALS_MAX = 2
    for title in ("one", "two"):
        goal_create(title=title, success_criteria="done", source=GoalSource.CONTEMPLATION)
    goal_create(title="the operator's", success_criteria="done")
    assert contemplate_start() is None
    assert not AgentRun.objects.exists()
    Goal.objects.filter(title="one").update(status=GoalStatus.ABANDONED)
    run = contemplate_start()
    assert run is not None and "Propose at most 1 goal " in run.context


@pytest.mark.django_db
def test_the_context_summarises_the_project(contemplation_settings: Any, repo: Path) -> None:
    goal_create(title="Ship the thing", success_criteria="shipped")
    text = contemplation_context(room=2)
    assert "Integration branch `main` (4 tracked files)" in text
    assert "- calc.py" in text and "demo: initial commit" in text
    assert "[proposed, operator] Ship the thing" in text
    assert "Propose at most 2 goals" in text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_hub_s_tasks_scan_and_contemplate_on_a_worker(worker: Worker) -> None:
    app.send_task("autopilot.scan")
    app.send_task("autopilot.contemplate")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        filed = Quantum.objects.filter(labels__contains=["scan:todo"]).count()
        if filed and Goal.objects.count() == 2:
            break
        time.sleep(0.2)
    assert Quantum.objects.filter(labels__contains=["scan:todo"]).count() == 1
    assert Goal.objects.filter(status=GoalStatus.PROPOSED).count() == 2, worker.log.read_text()


@pytest.mark.django_db
def test_each_repository_is_contemplated_on_its_own(
    contemplation_settings: Any, tmp_path: Path
) -> None:
    contemplation_settings.AUTOPILOT_PROPOSALS_MAX = 2
    default = repository_default()
    second_repo = demo_repo_ensure(tmp_path / "second")
    (second_repo / "only_in_second.py").write_text("x = 1\n")
    git("add", "only_in_second.py", cwd=second_repo)
    git("commit", "-q", "-m", "second: its own file", cwd=second_repo, author="op")
    second = repository_create(name="second", location=str(second_repo), inspect=repository_inspect)
    # The default repository's proposals are full; the second's are not.
    for title in ("one", "two"):
        goal_create(title=title, success_criteria="done", source=GoalSource.CONTEMPLATION)
    goal_create(
        title="Second's goal", success_criteria="done", repository_id=second.pk,
    )  # fmt: skip
    quantum_create(title="work in second", repository_id=second.pk)

    started = contemplations_start()

    assert started["default"] is None  # two proposals wait there already
    run = started["second"]
    assert run is not None
    anchor = Quantum.objects.get(pk=run.quantum_id)
    assert anchor.repository_id == second.pk and anchor.labels == filed_labels("contemplating")
    # Its context is the second repository's: its files, its goals, its quanta.
    assert "- only_in_second.py" in run.context and "Second's goal" in run.context
    assert "[proposed, contemplation] one" not in run.context
    assert "open: 1," in run.context
    assert "Propose at most 2 goals" in run.context
    # One live run per repository: the second's again does nothing; the default's, with room
    # again, gets a run and an anchor of its own.
    Goal.objects.filter(title="one").update(status=GoalStatus.ABANDONED)
    again = contemplations_start()
    assert again["second"] is None
    assert again["default"] is not None
    default_anchor = Quantum.objects.get(pk=again["default"].quantum_id)
    assert default_anchor.repository_id == default.pk and default_anchor.pk != anchor.pk
