"""The burst manager at scale: waves of 1,000, 5,000 and 10,000 quanta through the 3-stage
pipeline of wave_overhead.py (no-op executor), one after the other on the same workers.

For each wave prints agent stages per second, the memory (RSS) of the workers, in which the
manager's steps run, and of this process, which starts the wave; the statements per agent stage
that the manager sends (counted in every process that runs its steps: the workers through an
execute wrapper on Django's connections, read back by a control command, and `wave_start`
here), with BEGIN/COMMIT of its transactions added, and the transactions Postgres counted for
the database (pg_stat_database, less this process's own); and the dashboard's render time
(`/` through Django's test client, every 0.5 s while the wave runs: p50 / p95 / max, and the
CPU of a render, p50, which a busy machine does not inflate). All of these should stay flat as
the wave grows.

    python bench/wave_scale.py [--sizes 1000 5000 10000] [--workers 2] [--pool solo] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wave_overhead  # type: ignore[import-not-found]  # sets the environment workers inherit
from celery.worker.control import control_command
from django.db.backends.signals import connection_created

from bench._setup import pct, scratch_dir
from bench.peers import Machine, process_cpu, rss_mb

# What this process has sent through Django's connections: statements and commits.
COUNTS = {"statements": 0, "commits": 0}


def _count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    COUNTS["statements"] += 1
    return execute(sql, params, many, context)


def _counting(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Count every statement and commit of a new connection of this process."""
    if _count not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count)
    if not getattr(connection, "_bench_counted", False):
        commit = connection._commit

        def counted_commit() -> None:
            COUNTS["commits"] += 1
            commit()

        connection._commit = counted_commit
        connection._bench_counted = True


if os.environ.get("BENCH_COUNT_STATEMENTS"):
    connection_created.connect(_counting)


@control_command()
def bench_counts(state: Any) -> dict[str, int]:
    """This worker's statement and commit counts so far."""
    return dict(COUNTS)


def worker_counts(expected: int) -> dict[str, int]:
    """The statements and commits of all `expected` workers so far (asked until each answers)."""
    for _ in range(10):
        replies = wave_overhead.app.control.broadcast("bench_counts", reply=True, timeout=5)
        if len(replies or []) >= expected:
            break
    else:
        raise SystemExit(f"only {len(replies or [])} of {expected} workers gave their counts")
    total = {"statements": 0, "commits": 0}
    for reply in replies:
        for counts in reply.values():
            total["statements"] += counts["statements"]
            total["commits"] += counts["commits"]
    return total


def server_transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        # The statistics are flushed when a backend is idle for a moment or at most once a
        # second: wait for the workers' last ones (and count this statement's own).
        time.sleep(1.5)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


class DashboardSampler(threading.Thread):
    """GET / every `every` seconds until stopped, timing each response."""

    def __init__(self, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.times: list[float] = []
        # This thread's CPU per request: what the render costs without the waits for a core
        # that a busy machine adds to `times` (Postgres's share is in neither).
        self.cpu: list[float] = []
        self.statements = 0
        self.failed = ""
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.go = threading.Event()

    def run(self) -> None:
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client

        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(User.objects.get(username="bench-operator"))
        try:
            client.get("/", secure=True)  # warm: templates, this thread's connection
            self.ready.set()
            self.go.wait()
            self.sample(client)
        except Exception as exc:  # reported with the wave's figures, which stand without it
            self.failed = repr(exc)
        finally:
            self.ready.set()
            connection.close()

    def sample(self, client: Any) -> None:
        from django.db import connection

        with connection.execute_wrapper(self.count):
            while not self.stopping.wait(self.every):
                started, cpu = time.perf_counter(), time.thread_time()
                # secure: with DEBUG off, plain HTTP is redirected to HTTPS.
                response = client.get("/", secure=True)
                self.times.append(time.perf_counter() - started)
                self.cpu.append(time.thread_time() - cpu)
                if response.status_code != 200:
                    self.failed = f"GET / answered {response.status_code}"
                    return

    def count(self, execute: Callable[..., Any], *args: Any) -> Any:
        self.statements += 1
        return execute(*args)


def measure(n: int, pids: list[int]) -> dict[str, float]:
    from django.db import connection

    from bursts.models import WAVE_TERMINAL, AgentRun, Wave
    from bursts.services import wave_start

    label = f"scale-{os.getpid()}-{n}-{time.time_ns()}"
    wave_overhead.make_quanta(n, label)
    sampler = DashboardSampler()
    sampler.start()
    sampler.ready.wait()
    before = worker_counts(len(pids))
    transactions0 = server_transactions()
    driver = {"wave_start": 0, "other": 0}

    def counter(key: str) -> Callable[..., Any]:
        def count(execute: Callable[..., Any], *args: Any) -> Any:
            driver[key] += 1
            return execute(*args)

        return count

    cpu0, machine0, t0 = process_cpu(pids), Machine.now(), time.perf_counter()
    with connection.execute_wrapper(counter("wave_start")):
        wave = wave_start(labels=[label], started_by="bench")
    sampler.go.set()
    with connection.execute_wrapper(counter("other")):
        while (
            Wave.objects.filter(pk=wave.pk).values_list("status", flat=True)[0] not in WAVE_TERMINAL
        ):
            time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    machine, cpu = Machine.now().since(machine0), process_cpu(pids) - cpu0
    sampler.stopping.set()
    sampler.join()
    if sampler.failed:
        print(f"the dashboard failed while the wave ran: {sampler.failed}", file=sys.stderr)
    wave.refresh_from_db()
    assert wave.status == "done", (wave.status, wave.error)
    stages = AgentRun.objects.filter(quantum_run__wave=wave, status="done").count()
    assert stages == n * wave_overhead.AGENTS_PER_QUANTUM, stages
    wave_overhead.settle(timeout=300)  # the reviews and reflection that follow the wave
    after = worker_counts(len(pids))
    # This process's statements outside wave_start (the polls, the dashboard's requests, the
    # two statistics reads) are not the manager's; each is at most one transaction.
    ours = driver["other"] + sampler.statements + 2
    transactions = server_transactions() - transactions0 - ours
    statements = after["statements"] - before["statements"] + driver["wave_start"]
    commits = after["commits"] - before["commits"]
    times = sampler.times or [0.0]
    return {
        "stages_per_s": round(stages / elapsed, 1),
        "seconds": round(elapsed, 1),
        "statements_per_stage": round(statements / stages, 2),
        "with_begin_commit_per_stage": round((statements + 2 * commits) / stages, 2),
        "transactions_per_stage": round(transactions / stages, 2),
        "machine_cpu_ms_per_stage": round(machine / stages * 1000, 2),
        "worker_cpu_ms_per_stage": round(cpu / stages * 1000, 2),
        "workers_rss_mb": round(sum(rss_mb(pid) for pid in pids), 1),
        "bench_rss_mb": round(rss_mb(os.getpid()), 1),
        "dashboard_p50_ms": round(statistics.median(times) * 1000, 1),
        "dashboard_p95_ms": round(pct(times, 95) * 1000, 1),
        "dashboard_max_ms": round(max(times) * 1000, 1),
        "dashboard_cpu_p50_ms": round(statistics.median(sampler.cpu or [0.0]) * 1000, 1),
        "dashboard_samples": len(sampler.times),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    out = sys.stderr if args.json else sys.stdout
    os.environ["BENCH_COUNT_STATEMENTS"] = "1"  # the workers count theirs

    from _setup import django_bench_db  # type: ignore[import-not-found]

    django_bench_db("annihilation_bench_scale")
    from django.conf import settings
    from django.contrib.auth.models import User

    User.objects.create_superuser("bench-operator", password="bench-operator")
    print(f"DEBUG={settings.DEBUG} workers={args.workers} pool={args.pool}", file=out)
    print(f"workers' log: {wave_overhead.WORKER_LOG}", file=out)
    wave_overhead.ensure_pipeline()
    procs = wave_overhead.start_workers(args.workers, args.pool, imports=["wave_scale"])
    pids = [p.pid for p in procs]
    # The beat, as in production: its safety net steps a stage whose callback was lost (Celery
    # drops a chord callback whose dispatch claim expired on a busy machine), which would
    # otherwise leave the wave running for ever.
    schedule = scratch_dir("bench-beat-") / "schedule"
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "annihilation", "beat", "-s", str(schedule)],
            cwd=wave_overhead.ROOT,
            stdout=subprocess.DEVNULL,
            stderr=wave_overhead.WORKER_LOG.open("ab"),
        )
    )
    figures: dict[str, dict[str, float]] = {}
    try:
        wave_overhead.run_wave(1)  # warm-up: imports, connections
        wave_overhead.settle()
        print(
            f"idle workers' RSS {sum(rss_mb(pid) for pid in pids):.0f} MB;"
            f" load {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
            file=out,
        )
        print(
            f"{'N':>6} {'stages/s':>8} {'s':>6} {'stmts/stage':>11} {'+BEGIN/COMMIT':>13}"
            f" {'xacts/stage':>11} {'CPU ms/stage machine/workers':>28} {'workers RSS':>11} {'bench RSS':>9}"
            f" {'dashboard p50/p95/max (CPU p50)':>32} {'load':>5}",
            file=out,
        )
        for n in args.sizes:
            wave_overhead.settle()
            f = figures[str(n)] = measure(n, pids)
            print(
                f"{n:>6} {f['stages_per_s']:>8.0f} {f['seconds']:>6.0f}"
                f" {f['statements_per_stage']:>11.2f} {f['with_begin_commit_per_stage']:>13.2f}"
                f" {f['transactions_per_stage']:>11.2f} {f['machine_cpu_ms_per_stage']:>19.2f}"
                f" / {f['worker_cpu_ms_per_stage']:<6.2f}"
                f" {f['workers_rss_mb']:>8.0f} MB {f['bench_rss_mb']:>6.0f} MB"
                f" {f['dashboard_p50_ms']:>7.0f}/{f['dashboard_p95_ms']:.0f}/"
                f"{f['dashboard_max_ms']:.0f} ms ({f['dashboard_cpu_p50_ms']:.0f} ms)"
                f" {f['load']:>5.2f}",
                file=out,
            )
    finally:
        wave_overhead.stop_workers(procs)
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
