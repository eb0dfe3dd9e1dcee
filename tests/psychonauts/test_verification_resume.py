"""A build-verify-fix round survives a crash: the corrective message is part of the checkpoint."""

from __future__ import annotations

import pytest

from bursts.models import AgentStatus
from psychonauts.models import AgentTurn, Verification
from psychonauts.runtime.execute import agent_run_execute
from tests.psychonauts.crash import execute_killed_at_marker
from tests.psychonauts.stages import staged_run

pytestmark = pytest.mark.django_db(transaction=True)

CRASHY = """
name: crashy-fix
match: {labels: [crashy-fix]}
turns:
  - text: "Done."
  - tools:
      - shell: {command: "test -f marker || (touch marker && sleep 60)"}
  - tools:
      - write_file: {path: "status.txt", content: "fixed\\n"}
  - text: "Fixed."
"""


def test_a_run_killed_after_a_failed_round_resumes_with_the_corrective_message(
    repo, scripts, make_quantum, tmp_path
):
    scripts("crashy-fix", CRASHY)
    quantum = make_quantum(verify_commands=["grep -q fixed status.txt"], labels=["crashy-fix"])
    run = staged_run(quantum, "coder", verify=True, verify_retries=1)
    execute_killed_at_marker(run, repo=repo, tmp_path=tmp_path)
    run.refresh_from_db()
    assert run.status == AgentStatus.RUNNING
    first = AgentTurn.objects.get(agent_run=run, index=0)
    assert "Verification failed (round 1)" in first.tool_results[0]["text"]

    outcome = agent_run_execute(agent_run_id=run.pk)

    # The resumed conversation held the correction: the script went on with the fix (its turn
    # is the count of assistant messages), and round 1 was not run again.
    assert outcome.status == "done", outcome.error
    rounds = Verification.objects.filter(agent_run=run).order_by("round")
    assert [(v.round, v.passed) for v in rounds] == [(1, False), (2, True)]
    assert AgentTurn.objects.filter(agent_run=run).count() == 4
