"""DBOS peer: one durable workflow per quantum, each agent a step, the fan-out three steps
started as concurrent child workflows and awaited by the parent (DBOS's documented pattern for
running steps in parallel), then the last step.

The benchmark enqueues the workflows with a DBOSClient on one DBOS queue, which its worker
processes (`serve`) dequeue: each runs at most CONCURRENCY quantum workflows at once (the
queue's `worker_concurrency`, which needs a distinct `executor_id` per process) in its executor
threads, a parent's three children in threads of their own while it waits for them. The threads
share one interpreter lock: as a Celery solo worker, a process uses at most one core for Python."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from bench.peers import (
    AGENTS_PER_QUANTUM,
    Machine,
    PeerRun,
    process_cpu,
    require,
    scratch_database,
    start,
    stop,
    wait_until,
)

APP = "annihilation-bench-peer"
QUEUE = "bench_quanta"
WORKFLOW = "bench_quantum"
VERSION = "bench"
# The queue's dequeue poll (default 1 s): a worker claims up to its free slots per poll, so at
# 1 s a process could not pass CONCURRENCY quanta per second. 10 ms keeps the poll out of the
# figure at the cost of up to 100 claim queries a second per process when idle.
POLL_S = 0.01


def serve(url: str, executor_id: str, concurrency: int | str) -> None:
    """A DBOS worker process: registers the workflow, launches, serves the queue until SIGTERM."""
    dbos = require("dbos")
    DBOS: Any = dbos.DBOS

    @DBOS.step(name="bench_agent")
    def agent(role: str) -> str:
        return role

    @DBOS.workflow(name=WORKFLOW)
    def quantum(number: int) -> int:
        agent("planner")
        agent("coder")
        fan = [DBOS.start_workflow(agent, role) for role in ("reviewer", "tester", "security")]
        for handle in fan:
            handle.get_result()
        agent("tester")
        return number

    DBOS(
        config={
            "name": APP,
            "system_database_url": url,
            "run_admin_server": False,
            "executor_id": executor_id,
            "application_version": VERSION,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    # A queue is a row of the system database (each process registers the same settings).
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=int(concurrency),
        polling_interval_sec=POLL_S,
        on_conflict="always_update",
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print("ready", flush=True)
    stopping.wait()
    DBOS.destroy(workflow_completion_timeout_sec=0)


def run(n: int, *, workers: int, concurrency: int, warmup: int = 20) -> PeerRun:
    """N quanta through DBOS on `workers` processes, after a warm-up of `warmup` quanta."""
    dbos = require("dbos")
    import psycopg

    with scratch_database("annihilation_bench_dbos") as url:
        sa_url = url.replace("postgres://", "postgresql+psycopg://", 1)
        procs = []
        try:
            # One at a time: the first one's launch creates the schema.
            for number in range(workers):
                procs.append(
                    start("dbos_peer", sa_url, f"bench-{number}", str(concurrency), ready=True)
                )
            client = dbos.DBOSClient(system_database_url=sa_url, application_name=APP)
            with psycopg.connect(url, autocommit=True) as conn:

                def done() -> int:
                    row = conn.execute(
                        "SELECT count(*) FROM dbos.workflow_status"
                        " WHERE name = %s AND status = 'SUCCESS'",
                        [WORKFLOW],
                    ).fetchone()
                    return int(row[0]) if row else 0

                def wave(count: int, offset: int) -> None:
                    options = {"queue_name": QUEUE, "workflow_name": WORKFLOW}
                    options["app_version"] = VERSION
                    for i in range(count):
                        client.enqueue(options, offset + i)
                    wait_until(offset + count, done, timeout=600, what="DBOS")

                wave(warmup, 0)
                pids = [p.pid for p in procs]
                cpu0, machine0, t0 = process_cpu(pids), Machine.now(), time.perf_counter()
                wave(n, warmup)
                elapsed = time.perf_counter() - t0
                machine, cpu = Machine.now().since(machine0), process_cpu(pids) - cpu0
            client.destroy()
        finally:
            stop(procs)
    stages = n * AGENTS_PER_QUANTUM
    return PeerRun(stages / elapsed, machine / stages * 1000, cpu / stages * 1000)
