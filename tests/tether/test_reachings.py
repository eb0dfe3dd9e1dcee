"""Reachings with a real worker: the agent waits without a slot, an answer or the deadline resumes
it exactly once, late answers ground or supersede the drift, Redis may lose the queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from annihilation.celery import app
from bursts.models import AgentRun, AgentStatus
from core.models import Event
from psychonauts.models import Role, ToolCall
from psychonauts.runtime.execute import agent_run_execute
from quanta.models import Dependency, Quantum
from tests.polling import wait_for
from tests.tether.conftest import active_tasks, agent_status
from tether.errors import AlreadyDecided, NotFound
from tether.models import Drift, DriftStatus, Reaching, ReachingStatus
from tether.selectors import reachings_pending
from tether.services import (
    drift_ground,
    drift_reject,
    reaching_answer,
    reaching_expire,
    tether_sweep,
)

pytestmark = pytest.mark.django_db(transaction=True)

ASK = """
name: ask-{name}
match: {{labels: [{name}]}}
turns:
  - text: "Which way?"
    tools:
      - ask_tether: {{question: "{question}", priority: {priority}, assumption: "{assumption}", timeout_s: {timeout}}}
  - text: "Going on."
"""


def ask_script(scripts: Any, name: str, *, timeout: float = 300, priority: str = "normal",
               question: str = "Keep the old API?", assumption: str = "keep the old API") -> None:  # fmt: skip
    scripts(
        name,
        ASK.format(
            name=name, question=question, priority=priority, assumption=assumption, timeout=timeout
        ),
    )


def start_agent(make_run: Any, make_quantum: Any, label: str) -> int:
    run = make_run("coder", quantum=make_quantum(labels=[label]))
    app.send_task("psychonauts.tasks.execute_agent_run", args=(run.pk,))
    return int(run.pk)


def pending_reaching(run_id: int) -> Reaching:
    reaching: Reaching = wait_for(
        lambda: (
            agent_status(run_id) == AgentStatus.WAITING
            and Reaching.objects.filter(agent_run_id=run_id, status="pending").first()
        ),
        what="the agent to wait on a reaching",
    )
    return reaching


def call_output(run_id: int) -> str:
    return ToolCall.objects.get(agent_run_id=run_id, name="ask_tether").output


def started_count(run_id: int) -> int:
    return Event.objects.filter(type="started", payload__agent_run_id=run_id).count()


def test_it_frees_the_worker_while_waiting_and_resumes_with_the_answer(
    tether_worker, scripts, make_run, make_quantum
):
    ask_script(scripts, "asky")
    run_id = start_agent(make_run, make_quantum, "asky")
    reaching = pending_reaching(run_id)

    # The task returns right after the agent is marked waiting: its slot is free.
    wait_for(lambda: active_tasks(tether_worker) == 0, timeout=5, what="the slot to be freed")
    assert [r.pk for r in reachings_pending()] == [reaching.pk]

    result = reaching_answer(reaching_id=reaching.pk, text="drop it, nobody uses it")

    assert result.kind == "answered" and result.resumed
    wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the agent to finish")
    assert call_output(run_id) == "The Tether answered: drop it, nobody uses it"
    assert started_count(run_id) == 2
    assert not Drift.objects.exists()
    assert reachings_pending() == []
    with pytest.raises(AlreadyDecided):
        reaching_answer(reaching_id=reaching.pk, text="again")


KEPT_PROMPT = """
name: kept-prompt
match: {labels: [kept-prompt]}
turns:
  - tools:
      - ask_tether: {question: "Go on?", assumption: "go on", timeout_s: 300}
  - choose:
      - when: {prompt: "first words"}
        text: "The same first message."
      - text: "A rebuilt first message."
"""


def test_a_resumed_agent_reads_its_first_message_back_and_commits_nothing_it_did_not_change(
    tether_worker, scripts, make_run, make_quantum
):
    scripts("kept-prompt", KEPT_PROMPT)
    quantum = make_quantum(labels=["kept-prompt"], body="first words")
    run = make_run("coder", quantum=quantum)
    app.send_task("psychonauts.tasks.execute_agent_run", args=(run.pk,))
    reaching = pending_reaching(run.pk)
    # Built now, the prompt would no longer hold the first words.
    Quantum.objects.filter(pk=quantum.pk).update(body="other words")

    reaching_answer(reaching_id=reaching.pk, text="go on")

    wait_for(lambda: agent_status(run.pk) == AgentStatus.DONE, what="the agent to finish")
    assert AgentRun.objects.get(pk=run.pk).result == "The same first message."
    prompts = list(run.turns.order_by("index").values_list("prompt", flat=True))
    assert len(prompts) == 2 and "first words" in prompts[0] and prompts[1] == ""
    # It only asked the Tether: its end ran no git, so recorded no commit.
    assert not Event.objects.filter(type="committed", payload__agent_run_id=run.pk).exists()


def test_it_answers_and_wakes_the_agent_in_five_statements(
    tether_worker, scripts, make_run, make_quantum
):
    # An operator may answer a hundred questions a second: the answer is the reaching's
    # compare-and-set (returning the row), its event, the tool call's result, the agent's
    # waiting -> running and the read of where to send it.
    ask_script(scripts, "counted")
    run_id = start_agent(make_run, make_quantum, "counted")
    reaching = pending_reaching(run_id)

    with CaptureQueriesContext(connection) as queries:
        result = reaching_answer(reaching_id=reaching.pk, text="go on")

    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert result.kind == "answered" and result.resumed
    assert len(statements) == 5, statements
    assert sum("tether_reaching" in sql for sql in statements) == 1
    wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the agent to finish")
    assert call_output(run_id) == "The Tether answered: go on"
    answered = Reaching.objects.get(pk=reaching.pk)
    assert (answered.status, answered.answer, answered.answered_by) == (
        ReachingStatus.ANSWERED,
        "go on",
        "operator",
    )
    assert answered.answered_at is not None
    assert Event.objects.get(type="question_answered").payload["reaching_id"] == reaching.pk


def test_it_times_out_into_a_drift_and_resumes_on_the_assumption(
    tether_worker, scripts, make_run, make_quantum
):
    ask_script(scripts, "drifty", timeout=1, assumption="store dates in UTC")
    run_id = start_agent(make_run, make_quantum, "drifty")

    wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the agent to finish")

    reaching = Reaching.objects.get(agent_run_id=run_id)
    assert reaching.status == ReachingStatus.TIMED_OUT
    drift = Drift.objects.get(reaching=reaching)
    assert (drift.status, drift.assumption, drift.agent_run_id) == (
        DriftStatus.OPEN,
        "store dates in UTC",
        run_id,
    )
    assert drift.rationale == "Which way?"
    assert "Proceed on your stated assumption: store dates in UTC" in call_output(run_id)
    assert started_count(run_id) == 2
    assert Event.objects.filter(topic="tether:drifts", type="drift_created").count() == 1


def _timed_out(scripts: Any, make_run: Any, make_quantum: Any, name: str) -> Reaching:
    ask_script(scripts, name, timeout=0.5, assumption="store dates in UTC")
    run_id = start_agent(make_run, make_quantum, name)
    wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the agent to finish")
    return Reaching.objects.get(agent_run_id=run_id)


def test_it_grounds_the_drift_when_a_late_answer_agrees(
    tether_worker, scripts, make_run, make_quantum
):
    reaching = _timed_out(scripts, make_run, make_quantum, "late-yes")

    result = reaching_answer(reaching_id=reaching.pk, text="Store dates in UTC.")

    assert result.kind == "late_grounded"
    drift = Drift.objects.get(reaching=reaching)
    assert drift.status == DriftStatus.GROUNDED and drift.correction_id is None
    reaching.refresh_from_db()
    assert reaching.status == ReachingStatus.TIMED_OUT
    assert reaching.late_answer == "Store dates in UTC."
    assert not Quantum.objects.filter(kind="correction").exists()
    with pytest.raises(AlreadyDecided):
        reaching_answer(reaching_id=reaching.pk, text="yes")


def test_it_supersedes_the_drift_and_files_a_correction_when_a_late_answer_differs(
    tether_worker, scripts, make_run, make_quantum
):
    reaching = _timed_out(scripts, make_run, make_quantum, "late-no")

    result = reaching_answer(reaching_id=reaching.pk, text="No: local time, always")

    assert result.kind == "late_superseded"
    drift = Drift.objects.get(reaching=reaching)
    assert drift.status == DriftStatus.SUPERSEDED
    correction = Quantum.objects.get(pk=result.correction_id or 0)
    assert correction.kind == "correction"
    assert "store dates in UTC" in correction.body
    assert "No: local time, always" in correction.body
    assert Dependency.objects.filter(
        quantum=correction, depends_on_id=reaching.quantum_id, kind="discovered-from"
    ).exists()
    assert Event.objects.filter(topic="tether:reaching", type="late_answer_received").exists()
    assert Event.objects.filter(topic="tether:drifts", type="drift_superseded").exists()


def test_it_files_a_correction_when_the_operator_rejects_a_drift(
    tether_worker, scripts, make_run, make_quantum
):
    reaching = _timed_out(scripts, make_run, make_quantum, "reject-me")
    drift = Drift.objects.get(reaching=reaching)

    decided = drift_reject(drift_id=drift.pk, reason="we store local time")

    assert decided.status == DriftStatus.REJECTED
    correction = Quantum.objects.get(pk=decided.correction_id or 0)
    assert correction.kind == "correction" and "we store local time" in correction.body
    assert "store dates in UTC" in correction.body
    with pytest.raises(AlreadyDecided):
        drift_ground(drift_id=drift.pk)
    drift.refresh_from_db()
    assert drift.status == DriftStatus.REJECTED
    assert Quantum.objects.filter(kind="correction").count() == 1


def test_it_rebuilds_the_queue_and_keeps_every_deadline_after_redis_is_flushed(
    tether_worker, scripts, make_run, make_quantum, redis_client
):
    ask_script(scripts, "low", priority="low", timeout=300)
    ask_script(scripts, "crit", priority="critical", timeout=300)
    ask_script(scripts, "soon", priority="normal", timeout=4)
    low = pending_reaching(start_agent(make_run, make_quantum, "low"))
    crit = pending_reaching(start_agent(make_run, make_quantum, "crit"))
    soon_run = start_agent(make_run, make_quantum, "soon")
    soon = pending_reaching(soon_run)

    redis_client.flushall()  # the queue, the marker and the pending timer message are gone

    assert [r.pk for r in reachings_pending()] == [crit.pk, soon.pk, low.pk]
    result = reaching_answer(reaching_id=crit.pk, text="go")
    assert result.resumed
    wait_for(
        lambda: agent_status(crit.agent_run_id or 0) == AgentStatus.DONE, what="crit to finish"
    )
    # The timer message was flushed with Redis: the beat sweep times the reaching out instead.
    wait_for(lambda: agent_status(soon_run) == AgentStatus.DONE, timeout=30, what="soon")
    assert Drift.objects.filter(reaching=soon).exists()
    assert [r.pk for r in reachings_pending()] == [low.pk]


def race(reaching_id: int) -> list[str]:
    """Answer, timer and sweep on one overdue reaching at the same instant, in three threads."""
    barrier = threading.Barrier(3)
    outcomes: list[str] = []

    def answer() -> str:
        return reaching_answer(reaching_id=reaching_id, text="yes").kind

    def expire() -> str:
        return "expired" if reaching_expire(reaching_id=reaching_id) else "-"

    def sweep() -> str:
        return f"sweep {len(tether_sweep().expired)}"

    def go(action: Callable[[], str]) -> None:
        barrier.wait()
        try:
            outcomes.append(action())
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(f,)) for f in (answer, expire, sweep)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_it_resumes_once_when_an_answer_races_the_timeout(
    tether_worker, scripts, make_run, make_quantum
):
    ask_script(scripts, "race", timeout=300)
    for _ in range(5):
        run_id = start_agent(make_run, make_quantum, "race")
        reaching = pending_reaching(run_id)
        Reaching.objects.filter(pk=reaching.pk).update(deadline=reaching.created_at)

        outcomes = race(reaching.pk)

        wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the agent")  # noqa: B023
        reaching.refresh_from_db()
        # Exactly one resolution: answered (no drift), or timed out (a drift; an answer that
        # came second is a late answer).
        has_drift = Drift.objects.filter(reaching=reaching).exists()
        if reaching.status == ReachingStatus.ANSWERED:
            assert not has_drift, outcomes
        else:
            assert reaching.status == ReachingStatus.TIMED_OUT and has_drift, outcomes
        assert started_count(run_id) == 2, outcomes  # resumed once, never twice


def test_it_refuses_unknown_and_cancelled_reachings(db, make_quantum):
    quantum = make_quantum()

    cancelled = Reaching.objects.create(
        quantum=quantum,
        question="?",
        assumption="a",
        deadline=timezone.now(),
        status=ReachingStatus.CANCELLED,
    )
    with pytest.raises(NotFound):
        reaching_answer(reaching_id=999_999, text="x")
    with pytest.raises(AlreadyDecided):
        reaching_answer(reaching_id=cancelled.pk, text="x")
    cancelled.refresh_from_db()
    assert cancelled.answer == "" and cancelled.status == ReachingStatus.CANCELLED


def test_it_does_not_count_the_wait_against_the_role_timeout(
    tether_worker, scripts, make_run, make_quantum
):
    ask_script(scripts, "patient", timeout=300)
    run_id = start_agent(make_run, make_quantum, "patient")
    reaching = pending_reaching(run_id)
    Role.objects.filter(name="coder").update(timeout_s=2)
    time.sleep(3)  # longer than the role may run: only the time spent working counts

    reaching_answer(reaching_id=reaching.pk, text="go")

    wait_for(lambda: agent_status(run_id) in ("done", "error"), what="the agent to end")
    assert agent_status(run_id) == AgentStatus.DONE


SUB_AGENT_ASKS = {
    "sub-planner": """
name: sub-planner
match: {roles: [planner], labels: [sub-ask]}
turns:
  - tools:
      - spawn: {agents: [{role: coder, task: "decide"}]}
  - text: "planner done"
""",
    "sub-coder": """
name: sub-coder
match: {roles: [coder], labels: [sub-ask]}
turns:
  - tools:
      - ask_tether: {question: "Which format?", assumption: "use JSON", timeout_s: 300}
  - text: "coder went on"
""",
}


def test_it_lets_a_sub_agent_go_on_at_once_on_its_assumption(
    tether_settings, scripts, make_quantum, make_run, redis_client
):
    # A spawned child runs in its parent's thread: suspending it would hand the parent a
    # "waiting" result. It drifts at once instead, and the question takes a late answer.
    for name, text in SUB_AGENT_ASKS.items():
        scripts(name, text)
    run = make_run("planner", quantum=make_quantum(labels=["sub-ask"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    child = AgentRun.objects.get(parent=run)
    assert child.status == AgentStatus.DONE
    reaching = Reaching.objects.get(agent_run=child)
    assert reaching.status == ReachingStatus.TIMED_OUT
    drift = Drift.objects.get(reaching=reaching)
    assert (drift.status, drift.assumption) == (DriftStatus.OPEN, "use JSON")
    call = ToolCall.objects.get(agent_run=child, name="ask_tether")
    assert call.completed and "use JSON" in call.output
    assert "[done]" in ToolCall.objects.get(agent_run=run, name="spawn").output

    late = reaching_answer(reaching_id=reaching.pk, text="YAML, please", by="op")

    assert late.kind == "late_superseded"
    assert AgentRun.objects.get(pk=child.pk).status == AgentStatus.DONE  # nothing re-run
