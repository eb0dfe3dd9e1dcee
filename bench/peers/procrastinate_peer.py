"""procrastinate peer: jobs that defer the next. The first two agents run one after the other;
the second writes the quantum's fan-in counter (3) and defers the three fan-out jobs in one
batch; each of those decrements the counter in one UPDATE ... RETURNING, and the one that
brings it to 0 defers the last agent.

The benchmark defers the first job of every quantum in one batch; its worker processes
(`serve`) run async tasks on their event loop, CONCURRENCY jobs at once, woken by LISTEN/NOTIFY (procrastinate's default, which
its documentation recommends over polling) and keeping finished jobs (its default)."""

from __future__ import annotations

import asyncio
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

QUEUE = "bench"
FAN_IN = """
CREATE TABLE bench_fan_in (quantum integer PRIMARY KEY, remaining integer NOT NULL)
"""


def make_app(url: str) -> Any:
    procrastinate = require("procrastinate")
    app: Any = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="bench_agent", queue=QUEUE)
    async def agent(quantum: int, index: int) -> None:
        if index == 0:
            await agent.defer_async(quantum=quantum, index=1)
        elif index == 1:
            await app.connector.execute_query_async(
                "INSERT INTO bench_fan_in VALUES (%(quantum)s, 3)", quantum=quantum
            )
            await agent.batch_defer_async(*({"quantum": quantum, "index": i} for i in (2, 3, 4)))
        elif index in (2, 3, 4):
            row = await app.connector.execute_query_one_async(
                "UPDATE bench_fan_in SET remaining = remaining - 1"
                " WHERE quantum = %(quantum)s RETURNING remaining",
                quantum=quantum,
            )
            if row["remaining"] == 0:
                await agent.defer_async(quantum=quantum, index=5)

    app.bench_agent = agent
    return app


def serve(url: str, concurrency: int | str) -> None:
    """A procrastinate worker process until SIGTERM (its own signal handlers stop it)."""
    app = make_app(url)

    async def main() -> None:
        async with app.open_async():
            print("ready", flush=True)
            await app.run_worker_async(
                queues=[QUEUE], concurrency=int(concurrency), listen_notify=True, wait=True
            )

    asyncio.run(main())


def run(n: int, *, workers: int, concurrency: int, warmup: int = 20) -> PeerRun:
    """N quanta through procrastinate on `workers` processes, after a warm-up of `warmup`."""
    import psycopg

    with scratch_database("annihilation_bench_procrastinate") as url:
        app = make_app(url)

        async def setup() -> None:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                await app.connector.execute_query_async(FAN_IN)

        asyncio.run(setup())
        procs = []
        try:
            for _ in range(workers):
                procs.append(start("procrastinate_peer", url, str(concurrency), ready=True))
            with psycopg.connect(url, autocommit=True) as conn:

                def done() -> int:
                    row = conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                        " AND (args->>'index')::int = 5"
                    ).fetchone()
                    return int(row[0]) if row else 0

                def wave(count: int, offset: int) -> None:
                    async def defer() -> None:
                        async with app.open_async():
                            await app.bench_agent.batch_defer_async(
                                *({"quantum": offset + i, "index": 0} for i in range(count))
                            )

                    asyncio.run(defer())
                    wait_until(offset + count, done, timeout=600, what="procrastinate")

                wave(warmup, 0)
                pids = [p.pid for p in procs]
                cpu0, machine0, t0 = process_cpu(pids), Machine.now(), time.perf_counter()
                wave(n, warmup)
                elapsed = time.perf_counter() - t0
                machine, cpu = Machine.now().since(machine0), process_cpu(pids) - cpu0
        finally:
            stop(procs)
    stages = n * AGENTS_PER_QUANTUM
    return PeerRun(stages / elapsed, machine / stages * 1000, cpu / stages * 1000)
