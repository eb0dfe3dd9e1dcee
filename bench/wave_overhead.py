"""The burst manager's overhead against raw Celery, for the same DAG on the same workers.

(a) a wave of N quanta through a 3-stage pipeline (sequential 2 agents -> fan-out 3 ->
    sequential 1) with the no-op executor in place of the LLM;
(b) the same DAG per quantum as a raw Celery canvas of no-op tasks:
    chain(a, b, chord([c, d, e], f)).

Both run on the same broker and the same workers (started here, killed at the end). Prints
agent-stages per second for both, the ratio, and the time from `wave_start` to the first agent
running (for a 1-quantum wave, and within the large waves).

    python bench/wave_overhead.py [--sizes 200 1000] [--workers 2] [--pool solo]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import scratch_dir

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANNIHILATION_BURSTS_EXECUTOR"] = "noop"
# Production settings for both sides (this process and the workers it starts inherit them):
# DEBUG on wraps every query in Django's debug cursor, which logs it. `DEBUG=true` in the
# environment measures the development settings instead.
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # a strong one: DEBUG is off
# The tether reviews each finished run's branch after the wave drains it (a Celery task running
# git): give it an empty repository, as if the agents changed nothing, rather than a missing
# one whose retries would pollute the next measurement.
if "ANNIHILATION_REPO" not in os.environ:
    _repo = scratch_dir("bench-repo-")
    subprocess.run(["git", "init", "-q", str(_repo)], check=True)
    os.environ["ANNIHILATION_REPO"] = str(_repo)

from annihilation.celery import app

ROOT = Path(__file__).resolve().parents[1]
AGENTS_PER_QUANTUM = 6


@app.task(name="bench.noop", ignore_result=False)
def noop(*args: object) -> None:
    return None


def start_workers(count: int, pool: str) -> list[subprocess.Popen[bytes]]:
    extra = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}:{extra}"}
    procs = []
    for n in range(count):
        cmd = [
            sys.executable, "-m", "celery", "-A", "annihilation", "worker", "-P", pool,
            "-n", f"bench{n}-{os.getpid()}@%h", "-I", "wave_overhead", "-l", "error",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        if pool != "solo":
            cmd += ["-c", "1"]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=None)
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= count:
            return procs
    raise SystemExit("workers did not start")


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def settle(timeout: float = 60) -> None:
    """Wait until the queue is empty (what the last measurement left behind has run)."""
    client = redis.Redis.from_url(app.conf.broker_url)
    deadline = time.monotonic() + timeout
    while client.llen("celery") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)


def make_quanta(n: int, label: str) -> None:
    from quanta.models import Quantum

    Quantum.objects.bulk_create(
        Quantum(title=f"bench {label} {i}", labels=[label], pipeline="bench-3stage")
        for i in range(n)
    )


def ensure_pipeline() -> None:
    from quanta.pipelines.services import pipelines_save
    from quanta.pipelines.spec import AgentSpec, StageSpec

    def stage(index: int, name: str, mode: str, *roles: str) -> StageSpec:
        agents: list[AgentSpec] = [{"role": r, "settings": {}} for r in roles]
        return {
            "index": index,
            "name": name,
            "mode": mode,
            "agents": agents,
            "condition": "",
            "retries": 0,
            "timeout_s": 0,
        }

    pipelines_save(
        specs=[
            (
                "bench",
                {
                    "name": "bench-3stage",
                    "description": "benchmark shape",
                    "match_labels": ["bench-only"],
                    "match_kinds": [],
                    "is_default": False,
                    "stages": [
                        stage(0, "seq", "sequential", "planner", "coder"),
                        stage(1, "fan", "fan_out", "reviewer", "tester", "security"),
                        stage(2, "end", "sequential", "tester"),
                    ],
                },
            )
        ]
    )


def run_wave(n: int) -> tuple[float, float]:
    """(agent-stages per second, seconds from wave_start to the first agent running)."""
    from django.db.models import Min

    from bursts.models import WAVE_TERMINAL, AgentRun, Wave
    from bursts.services import wave_start

    label = f"bench-{os.getpid()}-{n}-{time.time_ns()}"
    make_quanta(n, label)
    from django.utils import timezone

    started = timezone.now()
    t0 = time.perf_counter()
    wave = wave_start(labels=[label], started_by="bench")
    while Wave.objects.filter(pk=wave.pk).values_list("status", flat=True)[0] not in WAVE_TERMINAL:
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    wave.refresh_from_db()
    assert wave.status == "done", (wave.status, wave.error)
    first = AgentRun.objects.filter(quantum_run__wave=wave).aggregate(m=Min("started_at"))["m"]
    agents = AgentRun.objects.filter(quantum_run__wave=wave, status="done").count()
    assert agents == n * AGENTS_PER_QUANTUM, agents
    return agents / elapsed, (first - started).total_seconds()


def run_raw(n: int) -> float:
    from celery import chain, chord, group

    t0 = time.perf_counter()
    results = [
        chain(
            noop.si(),
            noop.si(),
            chord(group(noop.si(), noop.si(), noop.si()), noop.si()),
        ).apply_async()
        for _ in range(n)
    ]
    # Poll the backend for each canvas's last task rather than `get()`: its pub/sub wait now
    # and then missed a result and hung the run. One GET per few ms costs the client nothing.
    deadline = time.monotonic() + 600
    for r in results:
        while not r.ready():
            if time.monotonic() > deadline:
                raise SystemExit("raw Celery canvases did not finish in 600 s")
            time.sleep(0.002)
    return n * AGENTS_PER_QUANTUM / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    args = parser.parse_args()

    from _setup import django_bench_db  # type: ignore[import-not-found]

    django_bench_db("annihilation_bench_waves")
    from django.conf import settings

    print(f"DEBUG={settings.DEBUG} workers={args.workers} pool={args.pool}")
    ensure_pipeline()
    procs = start_workers(args.workers, args.pool)
    try:
        run_wave(1)  # warm-up: imports, connections
        settle()
        small = sorted(run_wave(1)[1] for _ in range(5))
        print(
            f"start_wave -> first agent running (1-quantum wave, median of 5): {small[2] * 1000:.0f} ms"
        )
        print(
            f"{'N':>6} {'manager stages/s':>17} {'raw celery stages/s':>20} {'ratio':>6} {'first agent':>12}"
        )
        for n in args.sizes:
            settle()
            raw = run_raw(n)
            settle()
            managed, first = run_wave(n)
            print(
                f"{n:>6} {managed:>17.0f} {raw:>20.0f} {raw / managed:>5.2f}x {first * 1000:>9.0f} ms"
            )
        settle(timeout=120)  # leave no review tasks behind for the next run
    finally:
        stop_workers(procs)


if __name__ == "__main__":
    main()
