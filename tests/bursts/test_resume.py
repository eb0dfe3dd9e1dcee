"""Resuming an agent that waited on the Tether, against the two races of a fast answer.

The answer can land while the worker that suspended the agent is still finishing: before it has
recorded the outcome `waiting`, or before it has let go of the agent's lease.
"""

from __future__ import annotations

import threading

import pytest

from bursts.executor import Outcome
from bursts.leases import AgentLease
from bursts.models import AgentRun, AgentStatus, QuantumRun
from bursts.services import agent_resume, slot_run, wave_start
from quanta.services import quantum_create
from tests.bursts.conftest import pipeline

pytestmark = pytest.mark.django_db(transaction=True)


def answered_while_suspending(*, agent_run_id: int) -> Outcome:
    """Suspends as the runtime does (waiting), and the Tether answers before it returns."""
    AgentRun.objects.filter(pk=agent_run_id).update(status=AgentStatus.WAITING)
    assert agent_resume(agent_run_id=agent_run_id)
    return Outcome("waiting", error="waiting on the Tether")


def finishes(*, agent_run_id: int) -> Outcome:
    return Outcome("done", result=f"agent run {agent_run_id} resumed and finished")


@pytest.fixture
def agent(executor, redis_client) -> AgentRun:
    executor(answered_while_suspending)
    pipeline("one", ("sequential", ["coder"]), default=True)
    quantum = quantum_create(title="asks")
    wave_start()  # no worker here: the test plays the worker by calling slot_run
    return AgentRun.objects.get(quantum=quantum)


def test_it_keeps_an_agent_running_when_the_answer_beats_the_suspend(agent: AgentRun) -> None:
    run = QuantumRun.objects.get(quantum_id=agent.quantum_id)

    result = slot_run(quantum_run_id=run.pk, stage_index=0, position=0, prior=None)

    assert result["status"] == "waiting"  # this task stops; the resumed one carries on
    agent.refresh_from_db()
    assert (agent.status, agent.worker) == (AgentStatus.RUNNING, "")


def test_it_waits_for_the_lease_the_suspending_worker_still_holds(
    agent: AgentRun, executor
) -> None:
    executor(finishes)
    AgentRun.objects.filter(pk=agent.pk).update(status=AgentStatus.RUNNING, worker="")
    suspending = AgentLease(agent.pk).__enter__()
    assert suspending.held
    threading.Timer(0.3, suspending.__exit__, args=(None, None, None)).start()

    run = QuantumRun.objects.get(quantum_id=agent.quantum_id)

    result = slot_run(quantum_run_id=run.pk, stage_index=0, position=0, prior=None)

    assert result["status"] == "done"
    assert AgentRun.objects.get(pk=agent.pk).status == AgentStatus.DONE
