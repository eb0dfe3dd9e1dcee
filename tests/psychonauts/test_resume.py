"""A run killed mid-way resumes from its checkpoint and never repeats a completed tool call."""

from __future__ import annotations

import pytest

from bursts.models import AgentStatus
from psychonauts.models import AgentTurn, ToolCall
from psychonauts.runtime.execute import agent_run_execute
from tests.psychonauts.crash import execute_killed_at_marker

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


def test_it_resumes_after_a_kill_without_repeating_a_completed_tool_call(
    repo, scripts, make_quantum, make_run, tmp_path, settings
):
    scripts("crashy", CRASHY)
    run = make_run("coder", quantum=make_quantum(labels=["crashy"]))
    worktree = execute_killed_at_marker(run, repo=repo, tmp_path=tmp_path)
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
