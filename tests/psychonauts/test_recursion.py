"""Spawn: children are agent runs of their own; depth limit; the semaphore cannot deadlock."""

from __future__ import annotations

import threading

import pytest

from bursts.models import AgentRun, AgentStatus
from psychonauts.models import ToolCall
from psychonauts.routing import semaphore
from psychonauts.runtime.execute import agent_run_execute

pytestmark = pytest.mark.django_db(transaction=True)

TREE = {
    "tree-planner": """
name: tree-planner
match: {roles: [planner], labels: [tree]}
turns:
  - tools:
      - spawn: {agents: [{role: coder, task: "left"}, {role: coder, task: "right"}]}
  - text: "planner done"
""",
    "tree-coder": """
name: tree-coder
match: {roles: [coder], labels: [tree]}
turns:
  - tools:
      - spawn: {agents: [{role: tester, task: "a"}, {role: tester, task: "b"}]}
  - text: "coder {agent_id} done"
""",
    "tree-tester": """
name: tree-tester
match: {roles: [tester], labels: [tree]}
turns:
  - tools:
      - shell: {command: "sleep 0.2"}
  - tools:
      - report_verdict: {verdict: pass, reasons: "leaf {agent_id} checked"}
  - text: "leaf {agent_id}"
""",
}


@pytest.fixture
def tree(scripts):
    for name, text in TREE.items():
        scripts(name, text)


def test_it_runs_nested_fan_outs_with_fewer_slots_than_waiting_parents(
    repo, tree, make_quantum, make_run, settings, redis_client
):
    # Two slots, two children that each wait on two grandchildren: if a waiting parent kept
    # its slot, the grandchildren could never start (deadlock -> SlotTimeout after 10 s).
    settings.PSYCHONAUTS_SPAWN_SLOTS = 2
    settings.PSYCHONAUTS_SLOT_WAIT_S = 10
    run = make_run("planner", quantum=make_quantum(labels=["tree"]))
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], semaphore.slots_in_use())
            stop.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        outcome = agent_run_execute(agent_run_id=run.pk)
    finally:
        stop.set()
        sampler.join()

    assert outcome.status == "done", outcome.error
    descendants = AgentRun.objects.filter(agent_id__startswith=f"{run.agent_id}.")
    assert descendants.count() == 6
    assert set(descendants.values_list("status", flat=True)) == {AgentStatus.DONE}
    assert sorted(descendants.values_list("depth", flat=True)) == [1, 1, 2, 2, 2, 2]
    assert 1 <= peak[0] <= 2
    assert semaphore.slots_in_use() == 0
    spawn_result = ToolCall.objects.get(agent_run=run, name="spawn").output
    assert spawn_result.count("### Agent:") == 2
    assert "[done]" in spawn_result


def test_it_refuses_to_spawn_beyond_the_depth_limit(repo, tree, make_quantum, make_run, settings):
    settings.PSYCHONAUTS_SPAWN_DEPTH = 1
    run = make_run("planner", quantum=make_quantum(labels=["tree"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    refused = ToolCall.objects.filter(agent_run__parent=run, name="spawn")
    assert refused.count() == 2
    for call in refused:
        assert call.is_error
        assert "depth limit" in call.output
    assert not AgentRun.objects.filter(depth=2).exists()


def test_it_reuses_finished_children_when_the_parent_is_executed_again(
    repo, tree, make_quantum, make_run
):
    run = make_run("planner", quantum=make_quantum(labels=["tree"]))
    agent_run_execute(agent_run_id=run.pk)
    ids = set(AgentRun.objects.values_list("id", flat=True))
    # Pretend the parent crashed after its children finished but before it completed.
    ToolCall.objects.filter(agent_run=run).update(completed=False)
    from psychonauts.models import AgentTurn

    AgentTurn.objects.filter(agent_run=run, index=1).delete()
    AgentTurn.objects.filter(agent_run=run, index=0).update(complete=False, tool_results=[])
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.RUNNING)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done"
    assert set(AgentRun.objects.values_list("id", flat=True)) == ids, "no new children"
