"""Sub-agents on real workers: a spawned child holds no slot of its parent's stage, and the whole
spawn tree stops with its run, its stage or its wave."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import AGENT_LIVE, AgentRun, AgentStatus, QuantumRun, RunStatus, WaveStatus
from bursts.services import wave_cancel, wave_start
from core.models import Event
from psychonauts.models import ToolCall, Verification
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The coder spawns a planner that answers at once, then works on for a few seconds more: long
# enough for the safety net (every 0.5 s, a 1 s heartbeat TTL here) to look at the stage while
# the child is done and the coder is not.
SPAWNING_CODER = """
name: spawning-coder
match: {roles: [coder], labels: [spawn-slot]}
turns:
  - text: "Asking a planner first."
    tools:
      - spawn: {agents: [{role: planner, task: "plan quantum {quantum_id}"}]}
  - sleep: 4
    text: "Writing the change."
    tools:
      - write_file: {path: "done.txt", content: "done\\n"}
  - text: "Wrote done.txt."
"""
QUICK_PLANNER = """
name: quick-planner
match: {roles: [planner], labels: [spawn-slot]}
turns:
  - text: "Plan: write the file."
"""


def _scripts(tmp_path: Path, **scripts: str) -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
    return folder


def _psychonaut_worker(
    make_worker: Callable[..., Worker], tmp_path: Path, scripts: Path, name: str
) -> Path:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    make_worker(
        name,
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
    )
    return repo


def test_a_child_done_first_at_position_0_does_not_complete_its_parents_verify_stage(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    scripts = _scripts(tmp_path, coder=SPAWNING_CODER, planner=QUICK_PLANNER)
    repo = _psychonaut_worker(make_worker, tmp_path, scripts, "spawnslot")
    pipeline(
        "verified",
        {"mode": "sequential", "agents": ["coder"], "verify": True},
        ("sequential", ["planner"]),
        default=True,
    )
    quantum = quantum_create(
        title="a change with a helper",
        labels=["spawn-slot"],
        verify_commands=["test -f done.txt"],
    )

    wave = wait_wave(wave_start().pk, timeout=90)

    assert wave.status == WaveStatus.DONE
    run = QuantumRun.objects.get(quantum=quantum)
    coder = AgentRun.objects.get(quantum_run=run, stage_index=0, parent__isnull=True)
    child = AgentRun.objects.get(parent=coder)
    assert (child.stage_index, child.position, child.status) == (0, 0, AgentStatus.DONE)
    assert child.finished_at is not None and coder.finished_at is not None
    assert child.finished_at < coder.finished_at
    # The stage ended with its own agent: verified on the commit it made, and only then did the
    # next stage begin.
    assert coder.status == AgentStatus.DONE, coder.error
    verification = Verification.objects.get(agent_run=coder)
    tip = subprocess.run(
        ["git", "rev-parse", branch_for(quantum.pk)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert verification.passed and verification.commit_sha == tip
    planner = AgentRun.objects.get(quantum_run=run, stage_index=1, parent__isnull=True)
    assert planner.started_at is not None and planner.started_at >= coder.finished_at
    assert run.status == RunStatus.DONE
    assert not AgentRun.objects.filter(quantum=quantum, status__in=AGENT_LIVE).exists()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


# The coder hands the work to a planner and waits for it; the planner works on, a file a second,
# and would commit at its end. The stage's timeout (2 s) stops the coder first.
WAITING_CODER = """
name: waiting-coder
match: {roles: [coder], labels: [spawn-tree]}
turns:
  - tools:
      - spawn: {agents: [{role: planner, task: "do the work of quantum {quantum_id}"}]}
  - text: "The planner did it."
"""
SLOW_PLANNER = """
name: slow-planner
match: {roles: [planner], labels: [spawn-tree]}
turns:
  - {sleep: 1, tools: [{write_file: {path: "child-1.txt", content: "1\\n"}}]}
  - {sleep: 1, tools: [{write_file: {path: "child-2.txt", content: "2\\n"}}]}
  - {sleep: 1, tools: [{write_file: {path: "child-3.txt", content: "3\\n"}}]}
  - {sleep: 1, tools: [{write_file: {path: "child-4.txt", content: "4\\n"}}]}
  - {sleep: 1, tools: [{write_file: {path: "child-5.txt", content: "5\\n"}}]}
  - text: "Wrote five files."
"""


def _branch_tip(repo: Path, quantum_id: int) -> str:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-parse", "--verify", "-q", branch_for(quantum_id)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def test_a_failed_stage_stops_its_whole_spawn_tree_and_nothing_of_it_commits(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    scripts = _scripts(tmp_path, coder=WAITING_CODER, planner=SLOW_PLANNER)
    repo = _psychonaut_worker(make_worker, tmp_path, scripts, "spawntree")
    pipeline("timed", {"mode": "sequential", "agents": ["coder"], "timeout_s": 2}, default=True)
    quantum = quantum_create(title="a slow helper", labels=["spawn-tree"])
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()

    wave = wait_wave(wave_start().pk, timeout=60)

    run = QuantumRun.objects.get(quantum=quantum)
    assert run.status == RunStatus.ERROR
    assert run.finished_at is not None
    # Everything under the run has ended, each agent soon after the run (at its next turn).
    _wait(
        lambda: not AgentRun.objects.filter(quantum=quantum, status__in=AGENT_LIVE).exists(),
        15,
        "every agent of the run ended",
    )
    child = AgentRun.objects.get(quantum=quantum, parent__isnull=False)
    assert child.status == AgentStatus.CANCELLED, (child.status, child.error)
    assert child.error.startswith("stopped:")
    assert child.finished_at is not None
    assert (child.finished_at - run.finished_at).total_seconds() < 2.5
    # Nothing of it reached the branch, then or later.
    assert AgentRun.objects.filter(quantum=quantum).count() == 2  # no retry, no other child
    tip = _branch_tip(repo, quantum.pk)
    assert tip in ("", head), "a stopped agent committed to the quantum's branch"
    assert wave.status == WaveStatus.DONE


# The coder's model answers, after a while, with a spawn of three sub-agents: the wave is
# cancelled while that answer is on its way.
LATE_SPAWN = """
name: late-spawn
match: {roles: [coder], labels: [late-spawn]}
turns:
  - sleep: 3
    tools:
      - spawn:
          agents:
            - {role: planner, task: "one"}
            - {role: planner, task: "two"}
            - {role: planner, task: "three"}
  - text: "Done."
"""


def test_a_cancel_stops_a_spawn_in_flight_from_starting_sub_agents(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    scripts = _scripts(tmp_path, coder=LATE_SPAWN, planner=QUICK_PLANNER)
    _psychonaut_worker(make_worker, tmp_path, scripts, "latespawn")
    pipeline("one", ("sequential", ["coder"]), default=True)
    quantum = quantum_create(title="many helpers", labels=["late-spawn"])
    wave = wave_start()
    _wait(
        lambda: Event.objects.filter(
            topic__startswith=f"agent:{quantum.pk}_", type="phase"
        ).exists(),
        30,
        "the coder is waiting for its model's answer",
    )

    wave_cancel(wave_id=wave.pk)

    coder = AgentRun.objects.get(quantum=quantum, parent__isnull=True)
    _wait(
        lambda: ToolCall.objects.filter(agent_run=coder, name="spawn", completed=True).exists(),
        30,
        "the coder's spawn call was answered",
    )
    call = ToolCall.objects.get(agent_run=coder, name="spawn")
    assert call.is_error and "no longer running" in call.output
    assert not AgentRun.objects.filter(parent=coder).exists()
    coder.refresh_from_db()
    assert coder.status == AgentStatus.CANCELLED
