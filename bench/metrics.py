"""/metrics with 16 worker processes' data (target p95 < 50 ms).

Sixteen processes (as a worker's would) each count what a busy worker counts (stage durations
by outcome, tokens and cost for five models, errors, Tether waits, wave durations, validation
failures) into the multiprocess files and stay alive while `/metrics` is requested through the
whole Django stack (middleware, view, the file merge and the state gauges read from Postgres
and Redis) with 2,000 agent runs in the database. Then the sixteen exit and the alerter's
folding puts their files into the archives: the same scrape again.

    python bench/metrics.py [--processes 16] [--requests 200] [--json]
Uses the dev services (make bench) with a database of its own (annihilation_bench_metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DEBUG", "true")

from bench._setup import django_bench_db, pct, scratch_dir  # noqa: E402

# Before Django loads the settings: the metrics of this run in a folder of their own.
METRICS = scratch_dir("bench-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS)
django_bench_db("annihilation_bench_metrics")

from django.conf import settings  # noqa: E402
from django.test import Client  # noqa: E402

from bursts.models import AgentRun, AgentStatus  # noqa: E402
from core import metrics  # noqa: E402
from quanta.services import quantum_create  # noqa: E402

WORKER = """
import os, random, sys, django
sys.path.insert(0, {base!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
django.setup()
from core import metrics
rnd = random.Random({seed})
models = ["claude-haiku-4-5", "claude-sonnet-4-6", "claude-opus-4-6", "llama3.1:8b", "qwen2.5"]
for i in range(2000):
    status = rnd.choice(["done", "done", "done", "error", "waiting", "cancelled"])
    metrics.AGENT_STAGE_SECONDS.labels(status=status).observe(rnd.expovariate(1 / 60))
    model = rnd.choice(models)
    metrics.usage_recorded(provider="anthropic" if model.startswith("claude") else "openai",
                           model=model, tokens_in=rnd.randint(100, 5000),
                           tokens_out=rnd.randint(10, 800), cost_usd=rnd.random() / 100)
    if status == "error":
        metrics.error(rnd.choice(["agent", "executor", "task"]))
    if i % 50 == 0:
        metrics.tether_waited(rnd.expovariate(1 / 300), outcome="answered")
        metrics.validation_failed(rnd.choice(["api", "webhook", "cli", "form"]))
    if i % 500 == 0:
        metrics.wave_finished(status="done", seconds=rnd.expovariate(1 / 900))
print("ready", flush=True)
sys.stdin.read()
"""


def workers_start(n: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER.format(base=str(BASE), seed=i)],
            cwd=BASE,
            env=os.environ.copy(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def agents_fill(n: int) -> None:
    quantum = quantum_create(title="metrics bench")
    statuses = [AgentStatus.DONE] * 8 + [AgentStatus.ERROR, AgentStatus.RUNNING]
    AgentRun.objects.bulk_create(
        AgentRun(
            agent_id=f"{quantum.pk}_s0_coder_{i}",
            quantum=quantum,
            role="coder",
            status=statuses[i % len(statuses)],
        )
        for i in range(n)
    )


def scrape_times(client: Client, requests: int) -> tuple[list[float], list[float], int, int]:
    """Wall time and this process's CPU time of each request (on a shared machine the wall
    time also holds the waits for a CPU; the CPU time is the cost of a scrape itself)."""
    for _ in range(5):  # warm: URL resolution, templates of nothing, the first connections
        client.get("/metrics")
    times, cpu = [], []
    size = 0
    for _ in range(requests):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get("/metrics")
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        assert response.status_code == 200
        size = len(response.content)
    series = sum(
        1 for line in response.content.decode().splitlines() if line and not line.startswith("#")
    )
    return times, cpu, size, series


def figures_of(times: list[float], cpu: list[float], size: int, series: int) -> dict[str, float]:
    return {
        "p50_ms": round(pct(times, 50) * 1000, 2),
        "p95_ms": round(pct(times, 95) * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "cpu_p50_ms": round(pct(cpu, 50) * 1000, 2),
        "cpu_p95_ms": round(pct(cpu, 95) * 1000, 2),
        "bytes": size,
        "series": series,
        "files": len(list(METRICS.glob("*.db"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    settings.ALLOWED_HOSTS = ["testserver"]
    agents_fill(args.agents)
    client = Client()

    procs = workers_start(args.processes)
    live = figures_of(*scrape_times(client, args.requests))
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(30)
    folded_files = metrics.files_compact()
    folded = figures_of(*scrape_times(client, args.requests))
    figures = {
        "processes": args.processes,
        "requests": args.requests,
        "agents": args.agents,
        "live": live,
        "after_folding": {**folded, "files_folded": folded_files},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"/metrics, {args.processes} processes' data, {args.requests} requests")
    for name, f in (("live processes", live), ("after folding", folded)):
        print(
            f"  {name:15} p50 {f['p50_ms']:.2f} ms  p95 {f['p95_ms']:.2f} ms  "
            f"max {f['max_ms']:.2f} ms  (CPU p50 {f['cpu_p50_ms']:.2f} ms, "
            f"p95 {f['cpu_p95_ms']:.2f} ms; {f['files']:.0f} files, {f['series']:.0f} series, "
            f"{f['bytes'] / 1024:.1f} KiB)"
        )
    print(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    verdict = "met" if live["p95_ms"] < 50 and folded["p95_ms"] < 50 else "MISSED"
    print(f"  target p95 < 50 ms: {verdict}")


if __name__ == "__main__":
    main()
