"""Faults with real processes: a worker SIGKILLed mid-stage, Redis restarted mid-wave, lost
messages. The wave must still complete, no quantum lost or closed twice, no checkpointed agent
step executed twice."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from annihilation.celery import app
from bursts.leases import lease_alive
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus, WaveStatus
from bursts.services import safety_net, slot_run, wave_cancel, wave_start
from bursts.services.agent_runs import agent_run_start_dispatched
from core.models import Event
from quanta.models import Quantum, QuantumStatus
from quanta.services import quantum_create
from tests.bursts.conftest import ROOT, Worker, pipeline, wait_wave, worker_env
from tests.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 4


def steps_by_agent(log: Path) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            agent, step = line.split()
            found.setdefault(int(agent), []).append(int(step))
    return found


def assert_wave_whole(quanta: list[Quantum], log: Path) -> None:
    """Every quantum closed exactly once, every coder ran each step exactly once, one attempt."""
    for q in quanta:
        q.refresh_from_db()
        assert q.status == QuantumStatus.CLOSED, q
    closes = Counter(e.payload["quantum_id"] for e in Event.objects.filter(type="quantum_closed"))
    assert closes == {q.pk: 1 for q in quanta}
    coders = list(AgentRun.objects.filter(role="coder"))
    assert len(coders) == len(quanta) and all(a.attempt == 1 for a in coders)
    steps = steps_by_agent(log)
    for coder in coders:
        assert steps[coder.pk] == list(range(1, STEPS + 1)), (coder, steps.get(coder.pk))
    assert set(QuantumRun.objects.values_list("status", flat=True)) == {RunStatus.DONE}


def make_quanta(n: int) -> list[Quantum]:
    pipeline("faulty", ("sequential", ["coder"]), ("fan_out", ["reviewer", "tester"]), default=True)
    return [
        quantum_create(title=f"q{i}", body=f"steps coder {STEPS}\nstep_s 0.25") for i in range(n)
    ]


def test_it_completes_a_wave_when_a_worker_is_killed_mid_stage(
    make_worker: Callable[..., Worker], step_log: Path
) -> None:
    quanta = make_quanta(3)
    first = make_worker("doomed")
    wave = wave_start()
    wait_for(lambda: any(len(s) >= 2 for s in steps_by_agent(step_log).values()))

    first.kill()
    make_worker("successor")

    wave = wait_wave(wave.pk, timeout=40)
    assert wave.status == WaveStatus.DONE
    assert_wave_whole(quanta, step_log)


def test_the_safety_net_resends_stages_whose_messages_were_lost(
    make_worker: Callable[..., Worker],
) -> None:
    pipeline("one", ("sequential", ["coder"]), ("fan_out", ["reviewer", "tester"]), default=True)
    quanta = [quantum_create(title=f"q{n}") for n in range(3)]
    wave = wave_start()
    assert app.control.purge() >= 3  # the broker lost every queued stage (no worker yet)

    make_worker("rescuer")

    wave = wait_wave(wave.pk, timeout=30)
    assert wave.status == WaveStatus.DONE
    for q in quanta:
        q.refresh_from_db()
        assert q.status == QuantumStatus.CLOSED
    assert Event.objects.filter(type="stage_redispatched").count() >= 3


def test_the_safety_net_steps_an_ended_stage_only_when_its_callback_is_late(
    fast_settings: Any,
) -> None:
    """The last agent's task steps the run, perhaps after a wait in a busy queue: the safety
    net leaves it that long (the heartbeat TTL) before deciding the step was lost."""
    pipeline("one", ("sequential", ["coder"]), ("fan_out", ["reviewer", "tester"]), default=True)
    q = quantum_create(title="ended")
    wave_start()
    app.control.purge()  # no worker: the test plays the stage's part
    run = QuantumRun.objects.get(quantum=q)
    coder = AgentRun.objects.filter(quantum_run=run, stage_index=0)
    coder.update(status=AgentStatus.DONE, started_at=timezone.now(), finished_at=timezone.now())

    assert safety_net().advanced == []  # its step may still be queued
    run.refresh_from_db()
    assert run.current_stage == 0

    late = timezone.now() - timedelta(seconds=2 * fast_settings.BURSTS_HEARTBEAT_TTL_S)
    coder.update(finished_at=late)
    assert safety_net().advanced == [run.pk]
    run.refresh_from_db()
    assert run.current_stage == 1
    assert AgentRun.objects.filter(quantum_run=run, stage_index=1).count() == 2
    app.control.purge()


def test_the_safety_net_resends_at_once_a_stage_whose_started_agent_died(
    fast_settings: Any,
) -> None:
    """Within the dispatch grace a stage none of whose agents started is left to its queue; one
    whose started agent lost its lease and heartbeat (its worker or host died) goes again now."""
    fast_settings.BURSTS_DISPATCH_GRACE_S = 3600
    pipeline("one", ("sequential", ["coder"]), default=True)
    q = quantum_create(title="dies")
    wave_start()
    app.control.purge()  # no worker: the test plays the stage's part
    run = QuantumRun.objects.get(quantum=q)
    coder = AgentRun.objects.filter(quantum_run=run, stage_index=0)

    assert safety_net().redispatched == []  # pending, dispatched just now: still queued

    fresh = timezone.now()
    coder.update(status=AgentStatus.RUNNING, started_at=fresh, heartbeat_at=fresh)
    assert safety_net().redispatched == []  # alive (its heartbeat is recent)

    silent = timezone.now() - timedelta(seconds=2 * fast_settings.BURSTS_HEARTBEAT_TTL_S)
    coder.update(heartbeat_at=silent)
    assert safety_net().redispatched == [run.pk]
    assert Event.objects.filter(type="stage_redispatched", payload__run_id=run.pk).count() == 1
    app.control.purge()


def test_the_safety_net_and_the_drain_go_through_a_wave_in_chunks(
    fast_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs beyond one chunk are checked and drained as the first ones are (the chunks bound
    what a tick or a drain holds in memory, not what it covers)."""
    from bursts.services import safety, waves

    monkeypatch.setattr(safety, "SAFETY_CHUNK", 2)
    monkeypatch.setattr(waves, "DRAIN_CHUNK", 2)
    fast_settings.BURSTS_DISPATCH_GRACE_S = 3600
    pipeline("one", ("sequential", ["coder"]), default=True)
    quanta = [quantum_create(title=f"chunk {n}") for n in range(5)]
    wave = wave_start()
    app.control.purge()  # no worker: the test plays the agents, whose steps were lost
    long_ago = timezone.now() - timedelta(seconds=2 * fast_settings.BURSTS_HEARTBEAT_TTL_S)
    AgentRun.objects.filter(quantum_run__wave=wave).update(
        status=AgentStatus.DONE, started_at=long_ago, finished_at=long_ago
    )
    report = safety_net()
    assert sorted(report.advanced) == sorted(
        QuantumRun.objects.filter(wave=wave).values_list("pk", flat=True)
    )
    wave.refresh_from_db()
    assert wave.status == WaveStatus.DONE
    assert QuantumRun.objects.filter(wave=wave, drained_at__isnull=True).count() == 0
    assert {q.status for q in Quantum.objects.filter(pk__in=[q.pk for q in quanta])} == {
        QuantumStatus.CLOSED
    }


def test_a_second_delivery_takes_over_a_started_agent_only_once_its_heartbeat_lapsed(
    fast_settings: Any,
) -> None:
    """A dispatched agent's start compare-and-set is its claim: its Redis lease comes with the
    heartbeat's first beat. A second delivery of its task meanwhile finds it busy, and runs it
    (takes it over) only once its heartbeat is older than the TTL: the executor is gone."""
    fast_settings.BURSTS_DISPATCH_GRACE_S = 3600
    pipeline("one", ("sequential", ["coder"]), default=True)
    q = quantum_create(title="claimed")
    wave_start()
    app.control.purge()  # no worker: the test plays both deliveries
    run = QuantumRun.objects.get(quantum=q)
    coder = AgentRun.objects.get(quantum_run=run, stage_index=0)
    assert agent_run_start_dispatched(
        agent_run_id=coder.pk, worker="elsewhere:1:1", now=timezone.now(), context=None
    )
    assert lease_alive([coder.pk]) == set()  # no key yet: the claim is the database row

    again = slot_run(quantum_run_id=run.pk, stage_index=0, position=0, prior=None)
    assert again["status"] == "busy"
    coder.refresh_from_db()
    assert (coder.status, coder.worker) == (AgentStatus.RUNNING, "elsewhere:1:1")

    silent = timezone.now() - timedelta(seconds=2 * fast_settings.BURSTS_HEARTBEAT_TTL_S)
    AgentRun.objects.filter(pk=coder.pk).update(heartbeat_at=silent)
    taken = slot_run(quantum_run_id=run.pk, stage_index=0, position=0, prior=None)
    assert taken["status"] == "done"
    coder.refresh_from_db()
    assert coder.status == AgentStatus.DONE and coder.worker != "elsewhere:1:1"
    app.control.purge()


def test_the_safety_net_reads_a_wave_in_as_many_statements_whatever_its_size(
    fast_settings: Any,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fast_settings.BURSTS_DISPATCH_GRACE_S = 3600
    pipeline("one", ("sequential", ["coder"]), ("fan_out", ["reviewer", "tester"]), default=True)
    statements = []
    for size in (2, 20):
        for n in range(size):
            quantum_create(title=f"q{size}-{n}")
        wave = wave_start()
        app.control.purge()  # no worker: every stage waits within its grace
        with CaptureQueriesContext(connection) as queries:
            report = safety_net()
        assert report.waves == 1 and report.redispatched == [] and report.advanced == []
        statements.append(len(queries))
        wave_cancel(wave_id=wave.pk, reason="next size")
    assert statements[0] == statements[1], statements


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise AssertionError("private redis did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def test_it_completes_a_wave_when_redis_restarts_mid_wave(
    make_worker: Callable[..., Worker], step_log: Path, private_redis: PrivateRedis
) -> None:
    quanta = make_quanta(3)
    worker = make_worker("survivor", REDIS_URL=private_redis.url)
    # kombu 5.7's worker may exit ("Unrecoverable error") when the broker connection drops while
    # it holds unacknowledged messages; in production a supervisor restarts it. Be that supervisor.
    worker.supervise()
    # The wave is started and followed by the real command, on the private Redis.
    env = worker_env(REDIS_URL=private_redis.url, BURSTS_TEST_STEP_LOG=str(step_log))
    follow = subprocess.Popen(
        [sys.executable, "manage.py", "start_wave", "--follow", "--json", "--timeout", "60"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_for(lambda: any(len(s) >= 2 for s in steps_by_agent(step_log).values()))

    private_redis.kill()  # everything in Redis is gone: queues, chord counters, leases
    time.sleep(0.5)
    private_redis.start()

    _out, err = follow.communicate(timeout=90)
    assert follow.returncode == 0, err.decode()[-3000:]
    assert_wave_whole(quanta, step_log)
