from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import AgentRun, AgentStatus
from core.models import Event
from psychonauts.models import AgentTurn, DiaryEntry, ToolCall
from psychonauts.runtime.execute import agent_run_execute

pytestmark = pytest.mark.django_db


def test_it_edits_files_in_its_worktree_and_commits(repo: Path, make_run: Callable[..., AgentRun]):
    run = make_run("coder")

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    q = run.quantum_id
    worktree = repo.parent / "home" / "worktrees" / f"q-{q}"
    assert (worktree / "notes" / f"q{q}.md").read_text().startswith(f"# quantum {q}")
    log = subprocess.run(
        ["git", "log", "-1", "--format=%s", f"annihilation/q-{q}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert log == f"q-{q}: {run.agent_id} (coder)"
    assert not (repo / "notes").exists(), "the main checkout is untouched"
    run.refresh_from_db()
    assert run.status == AgentStatus.DONE
    assert run.phase == "done"
    assert "Added notes" in run.result
    assert DiaryEntry.objects.filter(agent_run=run, kind="accomplishment").exists()
    assert AgentTurn.objects.filter(agent_run=run).count() == 4


def test_it_publishes_phases_tool_calls_and_results(repo: Path, make_run):
    run = make_run("coder")

    agent_run_execute(agent_run_id=run.pk)

    events = list(Event.objects.filter(topic=f"agent:{run.agent_id}").order_by("id"))
    types = [e.type for e in events]
    assert types[0] == "started"
    assert types[-1] == "done"
    phases = [e.payload["phase"] for e in events if e.type == "phase"]
    assert {"thinking", "tool_use"} <= set(phases)
    calls = [e.payload["name"] for e in events if e.type == "tool_call"]
    assert calls == ["write_file", "shell", "diary"]
    assert sum(1 for t in types if t == "tool_result") == 3
    assert any(e.type == "text" for e in events)


def test_it_returns_the_stored_outcome_of_a_finished_run_without_executing_again(
    repo: Path, make_run
):
    run = make_run("coder")
    first = agent_run_execute(agent_run_id=run.pk)
    calls = ToolCall.objects.filter(agent_run=run).count()

    again = agent_run_execute(agent_run_id=run.pk)

    assert again == first
    assert ToolCall.objects.filter(agent_run=run).count() == calls
