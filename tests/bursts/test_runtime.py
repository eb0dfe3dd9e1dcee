"""The burst manager on the real agent runtime (psychonauts, scripted provider) — the demo's path."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import AgentRun, QuantumRun, WaveStatus
from bursts.services import wave_start
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import QuantumStatus
from quanta.services import dependency_add, quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_it_runs_a_wave_on_the_agent_runtime_with_retries_and_branches(
    make_worker: Callable[..., Worker], tmp_path: Path, settings: object
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    make_worker(
        "runtime",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
    )
    pipeline(
        "demo",
        {"name": "implement", "mode": "sequential", "agents": ["coder"], "retries": 1},
        # The `flaky` script fails the coder's first attempt.
        {"name": "review", "mode": "fan_out", "agents": ["reviewer", "tester"], "retries": 1},
        default=True,
    )
    first = quantum_create(title="first")
    flaky = quantum_create(title="flaky one", labels=["flaky"])
    dependency_add(quantum_id=flaky.pk, depends_on_id=first.pk)

    wave = wait_wave(wave_start().pk, timeout=60)

    assert wave.status == WaveStatus.DONE and wave.burst_count == 2
    for q in (first, flaky):
        q.refresh_from_db()
        assert q.status == QuantumStatus.CLOSED
    coder = list(
        AgentRun.objects.filter(quantum=flaky, role="coder")
        .order_by("attempt")
        .values_list("status", flat=True)
    )
    assert coder == ["error", "done"]
    assert QuantumRun.objects.get(quantum=flaky).status == "done"
    branches = subprocess.run(
        ["git", "branch", "--list", "annihilation/*"], cwd=repo, capture_output=True, text=True
    ).stdout
    assert branch_for(flaky.pk) in branches
