"""End to end: waves through real Celery workers (chains, chords, bursts, failures)."""

from __future__ import annotations

import pytest

from bursts.models import AgentRun, AgentStatus, Burst, QuantumRun, RunStatus, WaveStatus
from bursts.services import wave_start
from core.models import Event
from quanta.models import Comment, Quantum, QuantumStatus
from quanta.services import dependency_add, quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_it_runs_a_three_stage_pipeline_and_closes_every_quantum(worker: Worker) -> None:
    pipeline(
        "shape",
        {"name": "build", "mode": "sequential", "agents": ["planner", "coder"]},
        {"name": "review", "mode": "fan_out", "agents": ["reviewer", "tester", "security"]},
        {"name": "verify", "mode": "sequential", "agents": ["tester"]},
        default=True,
    )
    quanta = [quantum_create(title=f"task {n}") for n in range(3)]

    wave = wait_wave(wave_start().pk)

    assert wave.status == WaveStatus.DONE
    assert wave.burst_count == 1
    for q in quanta:
        q.refresh_from_db()
        assert q.status == QuantumStatus.CLOSED
        assert f"wave {wave.pk}" in q.close_reason and "pipeline shape" in q.close_reason
    assert AgentRun.objects.filter(status=AgentStatus.DONE).count() == 18
    assert wave.stats["runs"] == {"done": 3}
    run = QuantumRun.objects.get(quantum=quanta[0])
    assert [s["status"] for s in run.stages] == ["all_succeeded"] * 3


def test_it_runs_a_single_agent_stage_after_a_fan_out_in_the_chord_callback(
    worker: Worker,
) -> None:
    # The callback runs the `verify` agent in place: nothing is left for the safety net to
    # send again (its grace is 1.5 s here), and each run's events come in transition order.
    pipeline(
        "in-place",
        ("fan_out", ["reviewer", "tester"]),
        ("sequential", ["coder"]),
        ("fan_out", ["reviewer", "security"]),
        ("sequential", ["tester"]),
        default=True,
    )
    quanta = [quantum_create(title=f"in place {n}") for n in range(3)]

    wave = wait_wave(wave_start().pk)

    assert wave.status == WaveStatus.DONE
    assert AgentRun.objects.filter(status=AgentStatus.DONE).count() == 3 * 6
    for q in quanta:
        run = QuantumRun.objects.get(quantum=q)
        assert [s["status"] for s in run.stages] == ["all_succeeded"] * 4
        coder = AgentRun.objects.get(quantum=q, role="coder")
        assert f"### Agent: {q.pk}_s0_tester" in coder.context
        types = list(
            Event.objects.filter(topic="burst:events", payload__run_id=run.pk)
            .order_by("pk")
            .values_list("type", flat=True)
        )
        assert types == ["stage_completed"] * 4 + ["run_completed", "run_drained"]
    assert not Event.objects.filter(type="stage_redispatched").exists()


def test_it_leaves_a_quantum_someone_changed_meanwhile_and_says_so(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    moved = quantum_create(title="moved", body="sleep coder 1")
    fine = quantum_create(title="fine")
    wave = wave_start()
    # An operator (here: straight in the table) decides while the agent works.
    Quantum.objects.filter(pk=moved.pk).update(status=QuantumStatus.DEFERRED)

    wave = wait_wave(wave.pk)

    moved.refresh_from_db()
    fine.refresh_from_db()
    assert (moved.status, fine.status) == (QuantumStatus.DEFERRED, QuantumStatus.CLOSED)
    comment = Comment.objects.get(quantum=moved)
    assert "ended done" in comment.body and "could not be updated" in comment.body
    outcomes = dict(
        Event.objects.filter(type="run_drained").values_list(
            "payload__quantum_id", "payload__quantum_outcome"
        )
    )
    assert outcomes == {moved.pk: "untouched", fine.pk: "done"}
    assert wave.status == WaveStatus.DONE


def test_it_threads_each_agent_the_results_before_it(worker: Worker) -> None:
    pipeline(
        "threading",
        ("sequential", ["planner", "coder"]),
        ("fan_out", ["reviewer", "tester"]),
        default=True,
    )
    q = quantum_create(title="thread me")

    wait_wave(wave_start().pk)

    agents = {a.role: a for a in AgentRun.objects.filter(quantum=q)}
    planner, coder = agents["planner"], agents["coder"]
    assert planner.context == ""
    assert (
        coder.context == f"## Stage 0 Results\n\n### Agent: {q.pk}_s0_planner\n{planner.result}\n"
    )
    for role in ("reviewer", "tester"):
        ctx = agents[role].context
        assert f"### Agent: {q.pk}_s0_planner\n{planner.result}" in ctx
        assert f"### Agent: {q.pk}_s0_coder\n{coder.result}" in ctx
        assert "## Stage 1 Results" not in ctx  # fan-out agents share the same context


def test_it_runs_dependents_in_a_later_burst(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    base = quantum_create(title="base")
    middle = quantum_create(title="middle")
    top = quantum_create(title="top")
    dependency_add(quantum_id=middle.pk, depends_on_id=base.pk)
    dependency_add(quantum_id=top.pk, depends_on_id=middle.pk)
    other = quantum_create(title="independent")

    wave = wait_wave(wave_start().pk)

    assert wave.status == WaveStatus.DONE
    assert wave.burst_count == 3
    bursts = {r.quantum_id: r.burst.number for r in QuantumRun.objects.select_related("burst")}
    assert bursts == {base.pk: 1, other.pk: 1, middle.pk: 2, top.pk: 3}
    assert set(Burst.objects.filter(wave=wave).values_list("phase", flat=True)) == {"done"}


def test_it_retries_a_failing_agent_before_the_stage_fails(worker: Worker) -> None:
    pipeline(
        "retrying",
        {"name": "impl", "mode": "sequential", "agents": ["coder"], "retries": 1},
        default=True,
    )
    q = quantum_create(title="flaky", body="fail coder 1")

    wave = wait_wave(wave_start().pk)

    q.refresh_from_db()
    assert q.status == QuantumStatus.CLOSED
    attempts = list(
        AgentRun.objects.filter(quantum=q).order_by("attempt").values_list("attempt", "status")
    )
    assert attempts == [(1, "error"), (2, "done")]
    assert wave.stats["runs"] == {"done": 1}


def test_it_reopens_a_failed_quantum_with_a_comment_and_does_not_retry_it_in_the_wave(
    worker: Worker,
) -> None:
    pipeline("strict", ("sequential", ["coder", "tester"]), default=True)
    bad = quantum_create(title="doomed", body="fail coder 5")
    good = quantum_create(title="fine")

    wave = wait_wave(wave_start().pk)

    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.status, good.status) == (QuantumStatus.OPEN, QuantumStatus.CLOSED)
    run = QuantumRun.objects.get(quantum=bad)
    assert run.status == RunStatus.ERROR
    assert run.stages[0]["status"] == "sequential_blocked"
    assert QuantumRun.objects.filter(quantum=bad).count() == 1  # not collected again
    comment = Comment.objects.get(quantum=bad)
    assert f"wave {wave.pk}" in comment.body and "failed on purpose" in comment.body
    tester = AgentRun.objects.get(quantum=bad, role="tester")
    assert tester.status == AgentStatus.CANCELLED  # the chain broke before it
    assert wave.status == WaveStatus.DONE


def test_it_fails_a_fan_out_stage_when_one_agent_fails(worker: Worker) -> None:
    pipeline("fan", ("fan_out", ["reviewer", "security"]), default=True)
    q = quantum_create(title="insecure", body="fail security 9")

    wait_wave(wave_start().pk)

    run = QuantumRun.objects.get(quantum=q)
    assert run.status == RunStatus.ERROR
    assert run.stages[0]["status"] == "has_failures"
    assert AgentRun.objects.get(quantum=q, role="reviewer").status == AgentStatus.DONE


def test_it_blocks_a_quantum_after_consecutive_failed_runs(worker: Worker) -> None:
    # The workers run with ANNIHILATION_MAX_FAILURES=2.
    pipeline("strict", ("sequential", ["coder"]), default=True)
    q = quantum_create(title="hopeless", body="fail coder 99")

    wait_wave(wave_start().pk)
    q.refresh_from_db()
    assert q.status == QuantumStatus.OPEN
    wait_wave(wave_start().pk)

    q.refresh_from_db()
    assert q.status == QuantumStatus.BLOCKED
    assert (
        "Blocked after 2 consecutive failed runs"
        in Comment.objects.filter(quantum=q).latest("id").body
    )


def test_it_skips_a_stage_whose_condition_is_false(worker: Worker) -> None:
    pipeline(
        "conditional",
        {"name": "impl", "mode": "sequential", "agents": ["coder"]},
        {
            "name": "sec",
            "mode": "fan_out",
            "agents": ["security"],
            "condition": "'security' in labels",
        },
        {"name": "verify", "mode": "sequential", "agents": ["tester"]},
        default=True,
    )
    plain = quantum_create(title="plain")
    secure = quantum_create(title="secure", labels=["security"])

    wait_wave(wave_start().pk)

    plain_run = QuantumRun.objects.get(quantum=plain)
    assert [s["status"] for s in plain_run.stages] == ["all_succeeded", "skipped", "all_succeeded"]
    assert not AgentRun.objects.filter(quantum=plain, role="security").exists()
    assert AgentRun.objects.get(quantum=secure, role="security").status == AgentStatus.DONE
    assert Quantum.objects.get(pk=plain.pk).status == QuantumStatus.CLOSED


def test_it_fails_the_wave_at_max_bursts(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    a = quantum_create(title="a")
    b = quantum_create(title="b")
    c = quantum_create(title="c")
    dependency_add(quantum_id=b.pk, depends_on_id=a.pk)
    dependency_add(quantum_id=c.pk, depends_on_id=b.pk)

    wave = wait_wave(wave_start(max_bursts=2).pk)

    assert wave.status == WaveStatus.FAILED
    assert "limit of 2 bursts" in wave.error
    c.refresh_from_db()
    assert c.status == QuantumStatus.OPEN  # never claimed


def test_it_scopes_a_wave_to_its_labels(worker: Worker) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    ui = quantum_create(title="ui", labels=["frontend"])
    db = quantum_create(title="db", labels=["backend"])

    wait_wave(wave_start(labels=["frontend"]).pk)

    ui.refresh_from_db()
    db.refresh_from_db()
    assert (ui.status, db.status) == (QuantumStatus.CLOSED, QuantumStatus.OPEN)
