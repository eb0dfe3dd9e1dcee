"""Real Celery workers for the burst manager's tests.

A worker is a subprocess on the test database (pytest-django's `test_<name>`) and the same
Redis, with the test executor behind the seam (tests/bursts/worker.py installs it) and short
leases and graces so the safety net acts within a test's patience. A worker given
ANNIHILATION_BURSTS_EXECUTOR runs what that setting names instead: the agent runtime, or noop. Tests that use it are `transaction=True`: the worker must see
committed rows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.conf import settings
from django.db import connection

from bursts.executor import Executor
from bursts.models import WAVE_TERMINAL, Wave
from quanta.pipelines.services import pipelines_save
from quanta.pipelines.spec import PipelineSpec
from tests.bursts.executors import scripted

ROOT = Path(__file__).resolve().parents[2]
FAST = {
    "BURSTS_TEST_EXECUTOR": "scripted",
    "ANNIHILATION_HEARTBEAT_TTL_S": "1.0",
    "ANNIHILATION_DISPATCH_GRACE_S": "1.5",
    "ANNIHILATION_SAFETY_NET_INTERVAL_S": "0.5",
    "ANNIHILATION_MAX_FAILURES": "2",
}


@dataclass
class Worker:
    """One `celery worker` subprocess (threads pool) with beat embedded when asked."""

    env: dict[str, str]
    tmp: Path
    name: str
    beat: bool = True
    concurrency: int = 4
    step_log: Path = Path("/dev/null")
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    restarts: int = 0
    _supervising: bool = False

    def __post_init__(self) -> None:
        self.log = self.tmp / f"{self.name}.log"

    def start(self, *, wait: bool = True) -> Worker:
        cmd = [
            sys.executable, "-m", "celery", "-A", "tests.bursts.worker", "worker",
            "-P", "threads", "-c", str(self.concurrency), "-n", f"{self.name}@%h",
            "--without-gossip", "--without-mingle", "-l", "warning",
        ]  # fmt: skip
        if self.beat:
            cmd += ["-B", "-s", str(self.tmp / f"{self.name}-beat")]
        with self.log.open("ab") as out:
            # Its own process group: a kill takes the embedded beat child too, as systemd would.
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            with Celery(broker=self.env["REDIS_URL"]) as probe:
                replies = probe.control.ping(
                    destination=[f"{self.name}@{os.uname().nodename}"], timeout=0.3
                )
            if replies:
                return
        raise AssertionError(f"worker {self.name} not ready:\n{self.log.read_text()}")

    def wait_idle(self, timeout: float = 15, *, required: bool = False) -> None:
        """Until the broker's queue is empty and the worker has no task running or reserved,
        twice in a row (a chain's next task is sent as its last one ends): what a test started,
        reflection after its bursts included, is done before its tables are emptied under it.
        `required`: a test's wait for everything it sent to have run (AssertionError if the
        worker is still busy after `timeout`)."""
        if self.proc is None or self.proc.poll() is not None:
            assert not required, f"worker {self.name} is not running"
            return
        destination = [f"{self.name}@{os.uname().nodename}"]
        deadline = time.monotonic() + timeout
        idle = 0
        queue = redis.Redis.from_url(self.env["REDIS_URL"])
        with Celery(broker=self.env["REDIS_URL"]) as probe:
            while idle < 2 and time.monotonic() < deadline:
                inspect = probe.control.inspect(destination=destination, timeout=0.5)
                busy = [
                    task
                    for found in (inspect.active() or {}, inspect.reserved() or {})
                    for tasks in found.values()
                    for task in tasks
                ]
                idle = 0 if busy or queue.llen("celery") else idle + 1
                time.sleep(0.2)
        queue.close()
        assert idle >= 2 or not required, f"worker {self.name} still busy after {timeout} s"

    def supervise(self) -> None:
        """Restart the worker whenever it exits, as systemd or a container runtime would."""
        self._supervising = True

        def loop() -> None:
            while self._supervising:
                if self.proc is not None and self.proc.poll() is not None and self._supervising:
                    self.restarts += 1
                    self.start(wait=False)
                time.sleep(0.2)

        threading.Thread(target=loop, daemon=True).start()

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        self._supervising = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.kill()  # whatever of its group is left (the beat child after a SIGKILL)


def worker_env(**overrides: str) -> dict[str, str]:
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {**os.environ, **FAST, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    env.update(overrides)
    if "ANNIHILATION_BURSTS_EXECUTOR" in overrides:
        env.pop("BURSTS_TEST_EXECUTOR")
    return env


@pytest.fixture
def fast_settings(settings: Any, tmp_path: Path, executor: Callable[[Executor], Executor]) -> Any:
    """The test process itself uses the same executor and timings as the workers."""
    executor(scripted)
    settings.BURSTS_HEARTBEAT_TTL_S = 1.0
    settings.BURSTS_DISPATCH_GRACE_S = 1.5
    settings.QUANTUM_MAX_CONSECUTIVE_FAILURES = 2
    return settings


@pytest.fixture
def step_log(tmp_path: Path) -> Path:
    return tmp_path / "steps.log"


@pytest.fixture
def make_worker(
    tmp_path: Path, fast_settings: Any, step_log: Path
) -> Iterator[Callable[..., Worker]]:
    """Workers of one test (fault tests kill and restart them)."""
    made: list[Worker] = []

    def make(name: str = "w1", *, beat: bool = True, start: bool = True, **env: str) -> Worker:
        full = worker_env(BURSTS_TEST_STEP_LOG=str(step_log), **env)
        w = Worker(
            env=full,
            tmp=tmp_path,
            name=f"bursts-{name}-{os.getpid()}",
            beat=beat,
            step_log=step_log,
        )
        made.append(w)
        return w.start() if start else w

    yield make
    for w in made:
        w.stop()
    connection.close()


@pytest.fixture(scope="module")
def module_worker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """One worker for a whole module: starting one costs about a second and a half."""
    tmp = tmp_path_factory.mktemp("worker")
    env = worker_env(BURSTS_TEST_STEP_LOG=str(tmp / "steps.log"))
    w = Worker(
        env=env, tmp=tmp, name=f"bursts-mod-{os.getpid()}", step_log=tmp / "steps.log"
    ).start()
    yield w
    w.stop()


@pytest.fixture
def worker(module_worker: Worker, fast_settings: Any) -> Iterator[Worker]:
    yield module_worker
    module_worker.wait_idle()


def wait_wave(wave_id: int, timeout: float = 30) -> Wave:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wave = Wave.objects.get(pk=wave_id)
        if wave.status in WAVE_TERMINAL:
            return wave
        time.sleep(0.1)
    raise AssertionError(f"wave {wave_id} still running after {timeout} s")


def pipeline(
    name: str,
    *stages: tuple[str, list[str]] | dict[str, Any],
    default: bool = False,
    labels: list[str] | None = None,
    kinds: list[str] | None = None,
) -> PipelineSpec:
    """Save a pipeline: stages as (mode, roles) or full dicts (name, mode, agents, retries ...)."""
    specs: list[dict[str, Any]] = []
    for index, stage in enumerate(stages):
        s = {"mode": stage[0], "agents": stage[1]} if isinstance(stage, tuple) else dict(stage)
        specs.append(
            {
                "index": index,
                "name": s.get("name", f"s{index}"),
                "mode": s["mode"],
                "agents": [{"role": r, "settings": {}} for r in s["agents"]],
                "condition": s.get("condition", ""),
                "retries": s.get("retries", 0),
                "timeout_s": s.get("timeout_s", 0),
                **{k: s[k] for k in ("verify", "verify_retries", "verdict") if k in s},
            }
        )
    spec: PipelineSpec = {
        "name": name,
        "description": "",
        "match_labels": sorted(labels or []),
        "match_kinds": sorted(kinds or []),
        "is_default": default,
        "stages": specs,  # type: ignore[typeddict-item]
    }
    pipelines_save(specs=[("test", spec)])
    return spec
