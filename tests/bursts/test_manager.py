"""The manager's harder promises: continuous mode, cancel, double delivery, lost messages."""

from __future__ import annotations

from collections import Counter

import pytest

from annihilation.celery import app
from bursts.canvas import StageDispatch, stages_send_unsafe
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus, WaveStatus
from bursts.services import run_step, wave_advance, wave_cancel, wave_start
from bursts.services.waves import FIRST_COLLECT
from bursts.tasks import stage_done
from core.models import Event
from quanta.models import Comment, QuantumStatus
from quanta.services import dependency_add, quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave
from tests.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_it_starts_newly_unblocked_quanta_at_once_in_continuous_mode(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    slow = quantum_create(title="slow", body="sleep coder 2")
    quick = quantum_create(title="quick")
    after_quick = quantum_create(title="after quick")
    dependency_add(quantum_id=after_quick.pk, depends_on_id=quick.pk)

    wave = wait_wave(wave_start(continuous=True).pk)

    assert wave.status == WaveStatus.DONE and wave.burst_count == 1
    slow_run = QuantumRun.objects.get(quantum=slow)
    follower = QuantumRun.objects.get(quantum=after_quick)
    assert follower.started_at is not None and slow_run.finished_at is not None
    assert follower.started_at < slow_run.finished_at  # no burst barrier
    assert follower.status == RunStatus.DONE


def test_it_waits_for_the_burst_barrier_in_burst_mode(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    slow = quantum_create(title="slow", body="sleep coder 1")
    quick = quantum_create(title="quick")
    after_quick = quantum_create(title="after quick")
    dependency_add(quantum_id=after_quick.pk, depends_on_id=quick.pk)

    wait_wave(wave_start().pk)

    slow_run = QuantumRun.objects.get(quantum=slow)
    follower = QuantumRun.objects.get(quantum=after_quick)
    assert follower.started_at is not None and slow_run.finished_at is not None
    assert follower.started_at > slow_run.finished_at


def test_it_collects_a_backlog_larger_than_its_first_transaction_into_one_burst(
    worker: Worker,
) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    quanta = [quantum_create(title=f"q{i}") for i in range(FIRST_COLLECT + 8)]

    wave = wait_wave(wave_start().pk)

    assert wave.status == WaveStatus.DONE and wave.burst_count == 1
    runs = QuantumRun.objects.filter(wave=wave)
    assert runs.count() == len(quanta)
    assert set(runs.values_list("status", flat=True)) == {RunStatus.DONE}
    starts = Event.objects.filter(
        topic="burst:events", type="burst_started", payload__wave_id=wave.pk
    )
    assert starts.count() == 1


def test_it_cancels_a_wave_and_leaves_every_quantum_truthful(worker: Worker) -> None:
    pipeline("two", ("sequential", ["coder", "tester"]), default=True)
    busy = quantum_create(title="busy", body="sleep coder 20")
    wave = wave_start()
    wait_for(lambda: AgentRun.objects.filter(quantum=busy, role="coder", status="running").exists())

    wave_cancel(wave_id=wave.pk, reason="operator changed their mind")

    wave.refresh_from_db()
    busy.refresh_from_db()
    assert wave.status == WaveStatus.CANCELLED
    assert busy.status == QuantumStatus.OPEN
    assert "operator changed their mind" in Comment.objects.get(quantum=busy).body
    run = QuantumRun.objects.get(quantum=busy)
    assert run.status == RunStatus.CANCELLED and run.drained_at is not None
    statuses = dict(AgentRun.objects.filter(quantum=busy).values_list("role", "status"))
    assert statuses == {"coder": "cancelled", "tester": "cancelled"}
    # The running agent stops at its next turn and its outcome does not overwrite the cancel.
    worker.wait_idle(required=True)
    assert AgentRun.objects.get(quantum=busy, role="coder").status == AgentStatus.CANCELLED
    assert not AgentRun.objects.filter(
        quantum=busy, role="tester", started_at__isnull=False
    ).exists()


def test_it_revokes_the_stage_tasks_still_queued_when_a_wave_is_cancelled(
    worker: Worker,
) -> None:
    # Six fan-out agents on a worker of four threads: four run, two wait in the queue.
    pipeline("wide", ("fan_out", ["coder"] * 6), default=True)
    busy = quantum_create(title="busy", body="sleep coder 20")
    wave = wave_start()
    wait_for(lambda: AgentRun.objects.filter(quantum=busy, status="running").count() == 4)
    queued = list(
        AgentRun.objects.filter(quantum=busy, status="pending").values_list("task_id", flat=True)
    )
    assert len(queued) == 2 and all(queued)

    wave_cancel(wave_id=wave.pk)

    # The running four stop at their next check; the worker then takes the queued two and
    # drops them unrun: the result backend says so.
    wait_for(lambda: all(str(app.AsyncResult(t).state) == "REVOKED" for t in queued))
    assert not AgentRun.objects.filter(quantum=busy, task_id__in=queued, started_at__isnull=False)
    assert set(AgentRun.objects.filter(quantum=busy).values_list("status", flat=True)) == {
        AgentStatus.CANCELLED
    }


def test_it_changes_nothing_when_every_step_is_delivered_twice(worker: Worker) -> None:
    pipeline(
        "shape",
        ("sequential", ["planner", "coder"]),
        ("fan_out", ["reviewer", "tester"]),
        default=True,
    )
    q = quantum_create(title="twice", body="steps coder 3\nstep_s 0.15")
    wave = wave_start()
    run = QuantumRun.objects.get(quantum=q)
    # Deliver stage 0 twice more while it runs: a redelivery and a double dispatch.
    stages_send_unsafe([StageDispatch(run.pk, 0, "sequential", (0, 1))] * 2)
    wave = wait_wave(wave.pk)
    assert wave.status == WaveStatus.DONE

    # What a drained run and a closed burst send on (the Tether's change review, reflection)
    # is written by tasks of their own at their own pace: not the manager's steps, so their
    # events are left out of the count.
    manager_events = Event.objects.exclude(topic__startswith="reflection:").exclude(
        topic__startswith="tether:"
    )
    snapshot = (
        manager_events.count(),
        list(AgentRun.objects.order_by("id").values_list("id", "status", "attempt", "result")),
        Comment.objects.count(),
    )
    # And every step once more, after the end.
    for stage, mode, positions in ((0, "sequential", (0, 1)), (1, "fan_out", (0, 1))):
        stages_send_unsafe([StageDispatch(run.pk, stage, mode, positions)])
    stage_done.delay(quantum_run_id=run.pk, stage_index=1)
    app.send_task("bursts.wave_advance", args=(wave.pk,))
    run_step(quantum_run_id=run.pk, stage_index=1)
    wave_advance(wave_id=wave.pk)
    worker.wait_idle(required=True)

    coder = AgentRun.objects.get(quantum=q, role="coder")
    steps = [
        line
        for line in worker.step_log.read_text().splitlines()
        if line.split()[0] == str(coder.pk)
    ]
    assert steps == [f"{coder.pk} 1", f"{coder.pk} 2", f"{coder.pk} 3"]
    assert (
        manager_events.count(),
        list(AgentRun.objects.order_by("id").values_list("id", "status", "attempt", "result")),
        Comment.objects.count(),
    ) == snapshot
    closes = Counter(e.payload["quantum_id"] for e in Event.objects.filter(type="quantum_closed"))
    assert closes == {q.pk: 1}
