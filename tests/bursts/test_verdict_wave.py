"""A reviewing role's verdict on real workers: a tester's `fail` fails its stage, and the drain
reopens the quantum with the reasons as a comment for the next attempt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import AgentRun, QuantumRun, RunStatus, WaveStatus
from bursts.services import wave_start
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Comment, QuantumStatus
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REJECTING_TESTER = """
name: rejecting-tester
match: {roles: [tester], labels: [rejected]}
turns:
  - tools:
      - report_verdict: {verdict: fail, reasons: "test_calc.py: no test covers negative numbers"}
  - text: "Not yet."
"""


def test_a_testers_fail_verdict_fails_its_stage_and_reopens_the_quantum_with_the_reasons(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "rejecting-tester.yaml").write_text(REJECTING_TESTER, encoding="utf-8")
    make_worker(
        "verdict",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
    )
    pipeline("demo", ("sequential", ["coder"]), ("sequential", ["tester"]), default=True)
    quantum = quantum_create(title="negative numbers", labels=["rejected"])

    wave = wait_wave(wave_start().pk, timeout=60)

    assert wave.status == WaveStatus.DONE
    tester = AgentRun.objects.get(quantum=quantum, role="tester")
    assert (tester.status, tester.error) == (
        "error",
        "test_calc.py: no test covers negative numbers",
    )
    assert QuantumRun.objects.get(quantum=quantum).status == RunStatus.ERROR
    quantum.refresh_from_db()
    assert quantum.status == QuantumStatus.OPEN
    bodies = list(Comment.objects.filter(quantum=quantum).values_list("body", flat=True))
    assert any("no test covers negative numbers" in body for body in bodies), bodies
