"""A wave on a real Python repository whose tests need a package from a virtualenv: the coders
wait (without a worker) for the repository's environment, which the worker builds once; each
quantum's verify command, its real test, passes in it, and every quantum closes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import AgentRun, WaveStatus
from bursts.services import wave_start
from core.models import Event
from psychonauts.environments.models import BuildStatus, EnvironmentBuild, EnvironmentWaiter
from psychonauts.models import Verification
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import QuantumStatus
from quanta.pipelines.services import pipelines_save
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave
from tests.psychonauts.test_environments import python_project

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]


def test_a_wave_closes_its_quanta_with_their_real_tests_run_in_the_environment(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    python_project(repo)
    make_worker(
        "environment",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_ENV_DECLARATION="",
    )
    spec = pipeline("demo", ("sequential", ["coder"]), default=True)
    spec["stages"][0]["verify"] = True
    pipelines_save(specs=[("test", spec)])
    quanta = [
        quantum_create(title=f"greeting {n}", verify_commands=["python test_greet.py"])
        for n in range(3)
    ]

    wave = wait_wave(wave_start().pk, timeout=180)

    assert wave.status == WaveStatus.DONE
    for quantum in quanta:
        quantum.refresh_from_db()
        assert quantum.status == QuantumStatus.CLOSED
        rounds = list(Verification.objects.filter(quantum=quantum))
        assert rounds and rounds[-1].passed
        assert "tests passed" in str(rounds[-1].checks)
    build = EnvironmentBuild.objects.get()
    assert build.status == BuildStatus.READY
    assert not EnvironmentWaiter.objects.exists()
    # The coders started before it was built waited for it, then ran.
    reasons = Event.objects.filter(type="waiting").values_list("payload__reason", flat=True)
    assert any("repository's environment" in str(reason) for reason in reasons)
    assert set(AgentRun.objects.filter(role="coder").values_list("status", flat=True)) == {"done"}
