"""An attempt starts from its branch tip, and a verification runs on exactly the commit it
records: files an earlier attempt left uncommitted neither pass nor fail it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bursts.models import AgentRun, AgentStatus
from core.models import Event
from psychonauts.models import Verification
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.worktrees import worktree_path
from tests.psychonauts.stages import staged_run

pytestmark = pytest.mark.django_db

# Attempt 1 writes the file the verify command looks for, then its provider fails: the file is
# left in the worktree, never committed. Attempt 2 makes no tool call at all.
LEAVES_FILES = """
name: leaves-files
match: {labels: [leaves-files]}
turns:
  - attempts: [1]
    tools:
      - write_file: {path: "leftover.txt", content: "not committed\\n"}
  - attempts: [1]
    fail: "the connection dropped"
  - attempts: [2]
    text: "Nothing left to do."
"""


def _head(repo: Path, quantum_id: int) -> str:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-parse", "HEAD"],
        cwd=worktree_path(quantum_id),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _second_attempt(first: AgentRun) -> AgentRun:
    return AgentRun.objects.create(
        agent_id=first.agent_id,
        attempt=2,
        quantum=first.quantum,
        quantum_run=first.quantum_run,
        role=first.role,
    )


def test_a_retry_starts_from_the_branch_tip_and_does_not_pass_on_files_nobody_committed(
    repo, make_quantum, scripts
):
    scripts("leaves-files", LEAVES_FILES)
    quantum = make_quantum(labels=["leaves-files"], verify_commands=["test -f leftover.txt"])
    first = staged_run(quantum, "coder", verify=True, verify_retries=0)
    assert agent_run_execute(agent_run_id=first.pk).status == "error"
    assert (worktree_path(quantum.pk) / "leftover.txt").exists()
    base = _head(repo, quantum.pk)

    outcome = agent_run_execute(agent_run_id=_second_attempt(first).pk)

    assert not (worktree_path(quantum.pk) / "leftover.txt").exists()
    cleaned = Event.objects.get(type="workspace_cleaned")
    assert cleaned.payload["files"] == ["leftover.txt"]
    assert cleaned.payload["commit"] == base
    assert outcome.status == "error"
    assert not Verification.objects.filter(passed=True).exists()
    verification = Verification.objects.get(agent_run__attempt=2)
    assert verification.commit_sha == base and not verification.passed


def test_a_verification_does_not_run_on_a_tree_that_is_not_its_commit(repo, make_quantum, scripts):
    scripts("leaves-files", LEAVES_FILES)
    quantum = make_quantum(labels=["leaves-files"], verify_commands=["test -f leftover.txt"])
    first = staged_run(quantum, "coder", verify=True, verify_retries=0)
    assert agent_run_execute(agent_run_id=first.pk).status == "error"
    # Another agent of the quantum is at work in the same tree: the retry leaves the tree as
    # it is, and its verification must not take those files for its commit.
    AgentRun.objects.create(
        agent_id=f"{quantum.pk}_s0_tester",
        quantum=quantum,
        quantum_run=first.quantum_run,
        role="tester",
        status=AgentStatus.RUNNING,
    )

    outcome = agent_run_execute(agent_run_id=_second_attempt(first).pk)

    assert (worktree_path(quantum.pk) / "leftover.txt").exists()
    assert outcome.status == "error"
    verification = Verification.objects.get(agent_run__attempt=2)
    assert not verification.passed
    assert "leftover.txt" in verification.checks[0]["reason"]
    assert verification.commit_sha == _head(repo, quantum.pk)
