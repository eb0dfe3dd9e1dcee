"""Pipeline mutations proposed by a scripted agent: approve makes a new version, a timeout keeps
the old one and records a pipeline drift, a malformed proposal is a tool error."""

from __future__ import annotations

from typing import Any

import pytest

from bursts.models import AgentStatus
from psychonauts.models import ToolCall
from psychonauts.runtime.execute import agent_run_execute
from quanta.pipeline_models import Pipeline
from tests.bursts.conftest import pipeline
from tests.polling import wait_for
from tests.tether.conftest import SOLO_WITH_TESTER, agent_status
from tether.errors import AlreadyDecided, InvalidProposal
from tether.models import Drift, DriftKind, MutationStatus, PipelineMutation
from tether.selectors import mutations_list
from tether.services import mutation_approve, mutation_propose, mutation_reject

BAD = """name: solo
stages:
  - name: implement
    mode: sideways
    agents: []
"""


def propose(scripts: Any, make_run: Any, make_quantum: Any, text: str) -> int:
    indented = "\n".join("            " + line for line in text.splitlines())
    scripts(
        "proposer",
        f"""
name: proposer
match: {{labels: [propose]}}
turns:
  - tools:
      - propose_pipeline_change:
          pipeline: solo
          rationale: "a tester should check the coder's work"
          yaml: |
{indented}
  - text: "Carrying on with the current pipeline."
""",
    )
    run = make_run("coder", quantum=make_quantum(labels=["propose"]))
    outcome = agent_run_execute(agent_run_id=run.pk)
    assert outcome.status == "done", outcome.error
    return int(run.pk)


@pytest.fixture
def solo(db: None) -> None:
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])


def test_it_saves_a_new_version_when_the_operator_approves(
    solo, repo, scripts, make_run, make_quantum
):
    run_id = propose(scripts, make_run, make_quantum, SOLO_WITH_TESTER)
    mutation = PipelineMutation.objects.get(agent_run_id=run_id)
    output = ToolCall.objects.get(agent_run_id=run_id).output
    assert output.startswith(f"proposal #{mutation.pk} awaits the Tether")
    assert Pipeline.objects.get(name="solo").version == 1
    (view,) = mutations_list()
    assert view.current_version == 1 and "agents:\n  - coder" in view.current_yaml

    approved = mutation_approve(mutation_id=mutation.pk)

    assert (approved.status, approved.resulting_version) == (MutationStatus.APPROVED, 2)
    solo = Pipeline.objects.get(name="solo")
    assert solo.version == 2
    assert [s.name for s in solo.stages.order_by("index")] == ["implement", "check"]
    with pytest.raises(AlreadyDecided):
        mutation_reject(mutation_id=mutation.pk)


def test_it_returns_a_malformed_proposal_to_the_agent_and_stores_nothing(
    solo, repo, scripts, make_run, make_quantum
):
    run_id = propose(scripts, make_run, make_quantum, BAD)

    call = ToolCall.objects.get(agent_run_id=run_id)
    assert call.is_error and "invalid" in call.output and "mode" in call.output
    assert not PipelineMutation.objects.exists()
    assert Pipeline.objects.get(name="solo").version == 1


def test_it_refuses_a_proposal_made_against_an_older_version(
    solo, repo, scripts, make_run, make_quantum
):
    run_id = propose(scripts, make_run, make_quantum, SOLO_WITH_TESTER)
    mutation = PipelineMutation.objects.get(agent_run_id=run_id)
    pipeline("solo", ("sequential", ["coder", "reviewer"]), labels=["solo"])  # v2 meanwhile

    with pytest.raises(InvalidProposal, match="version 2"):
        mutation_approve(mutation_id=mutation.pk)
    mutation.refresh_from_db()
    assert mutation.status == MutationStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_it_keeps_the_old_version_and_records_a_pipeline_drift_on_timeout(
    tether_worker, tether_settings, scripts, make_run, make_quantum
):
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])
    tether_settings.TETHER_MUTATION_TIMEOUT_S = 0.5
    run_id = propose(scripts, make_run, make_quantum, SOLO_WITH_TESTER)
    assert agent_status(run_id) == AgentStatus.DONE  # the agent never waited on it

    mutation = wait_for(
        lambda: PipelineMutation.objects.filter(status=MutationStatus.TIMED_OUT).first(),
        what="the beat sweep to time the proposal out",
    )

    drift = Drift.objects.get(mutation=mutation)
    assert drift.kind == DriftKind.PIPELINE and drift.status == "open"
    assert "stays at version 1" in drift.assumption
    assert drift.rationale == "a tester should check the coder's work"
    assert Pipeline.objects.get(name="solo").version == 1


def test_a_proposal_may_not_make_itself_the_default_pipeline(solo):
    pipeline("main", ("sequential", ["coder"]), default=True)
    text = "name: solo\ndefault: true\nstages: [{name: implement, agents: [coder]}]\n"
    with pytest.raises(InvalidProposal, match="default pipeline in place of 'main'"):
        mutation_propose(pipeline="solo", text=text, rationale="make me the default")
    assert not PipelineMutation.objects.exists()
    assert Pipeline.objects.get(is_default=True).name == "main"
