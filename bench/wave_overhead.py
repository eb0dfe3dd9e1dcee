"""The burst manager's overhead against raw Celery, for the same DAG on the same workers.

(a) a wave of N quanta through a 3-stage pipeline (sequential 2 agents -> fan-out 3 ->
    sequential 1) with the no-op executor in place of the LLM;
(b) the same DAG per quantum as a raw Celery canvas of no-op tasks:
    chain(a, b, chord([c, d, e], f)).

Both run on the same broker and the same workers (started here, killed at the end). Prints
agent-stages per second for both, the ratio, the CPU each agent stage costs (the whole
machine's, from /proc/stat, and the workers' own), and the time from `wave_start` to the first
agent running (for a 1-quantum wave, and within the large waves).

With `--peers`, the same DAG per quantum also runs, in the same run and on the same Postgres
server, on durable engines a user could pick instead (bench/peers/: DBOS, procrastinate), each
with as many worker processes as Celery gets. `--json` prints one object keyed by wave size,
each holding agent stages per second under `raw_celery`, `manager` and each peer, and the
machine CPU per stage (ms) under `cpu_ms_per_stage`.

    python bench/wave_overhead.py [--sizes 200 1000] [--workers 2] [--pool solo]
        [--peers [dbos procrastinate]] [--peer-concurrency 1] [--json]
"""

from __future__ import annotations

import argparse
import json
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
from bench.peers import PEERS, Machine, PeerMissing, PeerRun, installed, process_cpu

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
# The workers log as in production (INFO: every task received and done) to this file rather
# than to the terminal, where they would bury the figures.
WORKER_LOG = Path(os.environ.get("ANNIHILATION_HOME", ROOT / ".annihilation")) / "bench-workers.log"


# `python -c PROFILED OUT celery ARGS`: Celery under cProfile timed by CPU (process_time), so
# that waiting for a core on a busy machine does not count; the stats go to OUT at shutdown.
PROFILED = """
import cProfile, runpy, sys, time
out, module = sys.argv.pop(1), sys.argv.pop(1)
profiler = cProfile.Profile(time.process_time)
profiler.enable()
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    profiler.disable()
    profiler.dump_stats(out)
"""


@app.task(name="bench.noop", ignore_result=False)
def noop(*args: object) -> None:
    return None


def start_workers(
    count: int, pool: str, imports: list[str] | None = None, profile: str = ""
) -> list[subprocess.Popen[bytes]]:
    """`count` workers that also import this module (its no-op task) and `imports`; with
    `profile`, each under cProfile, writing `<profile>.<n>` when it stops."""
    extra = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}:{extra}"}
    procs = []
    WORKER_LOG.parent.mkdir(parents=True, exist_ok=True)
    log = WORKER_LOG.open("wb")
    for n in range(count):
        cprofile = ["-c", PROFILED, f"{profile}.{n}"] if profile else ["-m"]
        cmd = [
            sys.executable, *cprofile, "celery", "-A", "annihilation", "worker", "-P", pool,
            "-n", f"bench{n}-{os.getpid()}@%h", "-I", ",".join(["wave_overhead", *(imports or [])]), "-l", "error",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        if pool != "solo":
            cmd += ["-c", "1"]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= count:
            return procs
    stop_workers(procs)  # those that did start end with the benchmark
    raise SystemExit(f"workers did not start in 30 s (their log: {WORKER_LOG})")


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
        (
            Quantum(title=f"bench {label} {i}", labels=[label], pipeline="bench-3stage")
            for i in range(n)
        ),
        batch_size=1000,  # a statement takes at most 65,535 parameters
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


def run_wave(n: int, pids: list[int] | None = None) -> tuple[PeerRun, float]:
    """(agent stages per second and CPU per stage on the workers `pids`, seconds from
    wave_start to the first agent running)."""
    from django.db.models import Min

    from bursts.models import WAVE_TERMINAL, AgentRun, Wave
    from bursts.services import wave_start

    label = f"bench-{os.getpid()}-{n}-{time.time_ns()}"
    make_quanta(n, label)
    from django.utils import timezone

    started = timezone.now()
    cpu0, machine0 = process_cpu(pids or []), Machine.now()
    t0 = time.perf_counter()
    wave = wave_start(labels=[label], started_by="bench")
    while Wave.objects.filter(pk=wave.pk).values_list("status", flat=True)[0] not in WAVE_TERMINAL:
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    machine, cpu = Machine.now().since(machine0), process_cpu(pids or []) - cpu0
    wave.refresh_from_db()
    assert wave.status == "done", (wave.status, wave.error)
    first = AgentRun.objects.filter(quantum_run__wave=wave).aggregate(m=Min("started_at"))["m"]
    agents = AgentRun.objects.filter(quantum_run__wave=wave, status="done").count()
    assert agents == n * AGENTS_PER_QUANTUM, agents
    run = PeerRun(agents / elapsed, machine / agents * 1000, cpu / agents * 1000)
    return run, (first - started).total_seconds()


def run_raw(n: int, pids: list[int]) -> PeerRun:
    from celery import chain, chord, group

    cpu0, machine0 = process_cpu(pids), Machine.now()
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
    elapsed = time.perf_counter() - t0
    machine, cpu = Machine.now().since(machine0), process_cpu(pids) - cpu0
    stages = n * AGENTS_PER_QUANTUM
    return PeerRun(stages / elapsed, machine / stages * 1000, cpu / stages * 1000)


def run_peer(peer: str, n: int, *, workers: int, concurrency: int) -> PeerRun:
    if peer == "dbos":
        from bench.peers import dbos_peer

        return dbos_peer.run(n, workers=workers, concurrency=concurrency)
    from bench.peers import procrastinate_peer

    return procrastinate_peer.run(n, workers=workers, concurrency=concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", default="solo", choices=["solo", "threads", "prefork"])
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=PEERS,
        default=None,
        help="durable peers to run too (all of them when none is named)",
    )
    parser.add_argument(
        "--peer-concurrency",
        type=int,
        default=1,
        help="jobs or quantum workflows one peer worker process runs at once (default 1, as a"
        " solo Celery worker runs one task at a time)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--profile",
        metavar="PREFIX",
        default="",
        help="run the workers under cProfile (PREFIX.0, PREFIX.1, ... written when they stop)"
        " and measure the manager's waves only",
    )
    args = parser.parse_args()
    peers = list(PEERS if args.peers == [] else args.peers or [])
    missing = [p for p in peers if not installed(p)]
    if missing:
        raise SystemExit(f"{', '.join(missing)}: not installed; pip install -e '.[peers]'")
    # With --json, stdout holds the JSON alone; the table goes to stderr.
    out = sys.stderr if args.json else sys.stdout

    from _setup import django_bench_db  # type: ignore[import-not-found]

    django_bench_db("annihilation_bench_waves")
    from django.conf import settings

    print(
        f"DEBUG={settings.DEBUG} workers={args.workers} pool={args.pool}"
        + (f" peers={','.join(peers)} x{args.peer_concurrency} each" if peers else ""),
        file=out,
    )
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", file=out)
    print(f"workers' log: {WORKER_LOG}", file=out)
    ensure_pipeline()
    procs = start_workers(args.workers, args.pool, profile=args.profile)
    pids = [p.pid for p in procs]
    figures: dict[str, dict[str, object]] = {}
    try:
        run_wave(1)  # warm-up: imports, connections
        settle()
        small = sorted(run_wave(1)[1] for _ in range(5))
        print(
            f"start_wave -> first agent running (1-quantum wave, median of 5): {small[2] * 1000:.0f} ms",
            file=out,
        )
        print(
            f"{'N':>6} {'engine':>14} {'stages/s':>9} {'machine CPU/stage':>18}"
            f" {'workers CPU/stage':>18} {'vs manager':>11}",
            file=out,
        )
        for n in args.sizes:
            settle()
            runs: dict[str, PeerRun] = {}
            if not args.profile:
                runs["raw_celery"] = run_raw(n, pids)
                settle()
            runs["manager"], first = run_wave(n, pids)
            for peer in [] if args.profile else peers:
                settle()
                runs[peer] = run_peer(
                    peer, n, workers=args.workers, concurrency=args.peer_concurrency
                )
            manager = runs["manager"].stages_per_s
            for engine, run in runs.items():
                print(
                    f"{n:>6} {engine:>14} {run.stages_per_s:>9.0f} {run.machine_ms:>15.2f} ms"
                    f" {run.worker_ms:>15.2f} ms {run.stages_per_s / manager:>10.2f}x",
                    file=out,
                )
            raw = runs["raw_celery"].stages_per_s if "raw_celery" in runs else float("nan")
            print(
                f"{n:>6} raw Celery / manager {raw / manager:.2f}x; first agent in the wave"
                f" {first * 1000:.0f} ms; load {os.getloadavg()[0]:.2f}",
                file=out,
            )
            figures[str(n)] = {
                **{engine: round(run.stages_per_s, 1) for engine, run in runs.items()},
                "cpu_ms_per_stage": {
                    engine: round(run.machine_ms, 2) for engine, run in runs.items()
                },
                "load": round(os.getloadavg()[0], 2),
            }
        settle(timeout=120)  # leave no review tasks behind for the next run
    except PeerMissing as exc:
        raise SystemExit(str(exc)) from None
    finally:
        stop_workers(procs)
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
