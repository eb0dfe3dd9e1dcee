"""The autopilot's tick at scale: 10,000 quanta and 1,000 goals.

A quarter of the quanta carry the `autopilot` label; of all of them a fifth are ready (open, no
open blocker), a fifth wait on a blocker, the rest are closed, in progress or deferred. The goals
are spread over every status; the integration branch has a history of checks; a wave scoped to
the autopilot runs with 50 agents mid-turn (their turns and events recorded). The hub is resumed
and, with ready quanta and approved goals, executing: each tick sends the goals' tasks to Celery
after commit, as it does in production.

Prints p50/p95 of `hub_tick` and of `snapshot_take` alone against the 20 ms p95 target, and the
statements one tick runs.

    .venv/bin/python bench/autopilot_tick.py [--ticks 300] [--json]   (needs `make services`)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import django_bench_db, ms, pct

N_QUANTA = 10_000
N_GOALS = 1_000
AUTOPILOT_SHARE = 0.25
RUNNING_AGENTS = 50
TARGET_P95_S = 0.020


def populate() -> dict[str, int]:
    from django.db import connection
    from django.utils import timezone

    from autopilot.labels import filed_labels, goal_label
    from autopilot.models import BaseCheck, Goal, GoalStatus, Hub
    from bursts.models import AgentRun, AgentStatus, Wave
    from core.models import Event
    from psychonauts.models import AgentTurn
    from quanta.models import Dependency, Quantum

    rng = random.Random(20)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE quanta_comment, quanta_dependency, quanta_quantum RESTART IDENTITY CASCADE"
        )
    statuses = ["open"] * 40 + ["closed"] * 40 + ["in_progress"] * 10 + ["deferred"] * 10
    quanta = []
    for n in range(N_QUANTA):
        mine = rng.random() < AUTOPILOT_SHARE
        labels = filed_labels("executing", goal_label(rng.randrange(1, N_GOALS))) if mine else []
        quanta.append(
            Quantum(
                title=f"quantum {n}",
                body="work " * 20,
                priority=rng.randrange(5),
                labels=[*labels, f"team{n % 7}"],
                status=rng.choice(statuses),
            )
        )
    Quantum.objects.bulk_create(quanta, batch_size=2000)
    ids = [q.pk for q in quanta]
    # Half of the open quanta wait on a blocker that is still open: not ready.
    open_ids = [q.pk for q in quanta if q.status == "open"]
    blockers = open_ids[: len(open_ids) // 2]
    waiting = open_ids[len(open_ids) // 2 :]
    Dependency.objects.bulk_create(
        [
            Dependency(quantum_id=q, depends_on_id=blockers[i % len(blockers)], kind="blocks")
            for i, q in enumerate(waiting)
        ],
        batch_size=2000,
    )
    goal_statuses = list(GoalStatus.values)
    Goal.objects.bulk_create(
        [
            Goal(
                title=f"goal {n}",
                success_criteria="it works",
                status=goal_statuses[n % len(goal_statuses)],
                priority=rng.randrange(5),
            )
            for n in range(N_GOALS)
        ],
        batch_size=1000,
    )
    BaseCheck.objects.bulk_create(
        [
            BaseCheck(sha=f"{n:040x}", ok=n % 5 != 0, summary="- PASSED: `make test`")
            for n in range(500)
        ]
    )
    Wave.objects.create(labels=["autopilot"], started_by="autopilot")
    agents = [
        AgentRun(
            agent_id=f"{ids[n]}_s0_coder",
            quantum_id=ids[n],
            role="coder",
            status=AgentStatus.RUNNING,
            started_at=now,
            heartbeat_at=now,
        )
        for n in range(RUNNING_AGENTS)
    ]
    AgentRun.objects.bulk_create(agents)
    AgentTurn.objects.bulk_create(
        [AgentTurn(agent_run=a, index=i) for a in agents for i in range(5)]
    )
    Event.objects.bulk_create(
        [
            Event(topic=f"agent:{a.agent_id}", type="phase", payload={"phase": "thinking"})
            for a in agents
            for _ in range(20)
        ]
    )
    Hub.objects.get_or_create(pk=1)
    Hub.objects.filter(pk=1).update(paused=False, paused_reason="", scanned_at=now,
                                    contemplated_at=now)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    from quanta.selectors import quanta_ready

    return {
        "quanta": N_QUANTA,
        "autopilot_quanta": sum(1 for q in quanta if "autopilot" in q.labels),
        "ready_autopilot": quanta_ready(labels=["autopilot"]).count(),
        "goals": N_GOALS,
        "running_agents": RUNNING_AGENTS,
    }


def timed(fn: Any, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    django_bench_db("annihilation_bench_autopilot")
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from autopilot.services.hub import hub_tick
    from autopilot.snapshot import snapshot_take
    from core.redis import get_redis

    settings.SPEND_CAP_DAY_USD = 100.0  # a cap to check, not reached
    settings.TETHER_VERIFY_COMMANDS = []  # no base checks sent
    sizes = populate()
    first = hub_tick()
    for _ in range(20):  # warm: statement caches, connection
        hub_tick()
        snapshot_take()
    with CaptureQueriesContext(connection) as queries:
        tick = hub_tick()
    statements = [q["sql"] for q in queries.captured_queries]
    snap_times = timed(snapshot_take, args.ticks)
    cpu = time.process_time()
    tick_times = timed(hub_tick, args.ticks)
    cpu_per_tick = (time.process_time() - cpu) / args.ticks
    # The tasks the ticks sent wait in this benchmark's broker queue: drop them.
    get_redis().delete("celery")
    figures = {
        **sizes,
        "ticks": args.ticks,
        "state": str(tick.state),
        "reason": tick.reason,
        "first_transition": f"{first.state}: {first.reason}",
        "sent_per_tick": list(tick.sent),
        "statements_per_tick": len(statements),
        "tick_p50_ms": round(pct(tick_times, 50) * 1000, 2),
        "tick_p95_ms": round(pct(tick_times, 95) * 1000, 2),
        "tick_cpu_ms": round(cpu_per_tick * 1000, 2),
        "load_average": round(os.getloadavg()[0], 2),
        "snapshot_p50_ms": round(pct(snap_times, 50) * 1000, 2),
        "snapshot_p95_ms": round(pct(snap_times, 95) * 1000, 2),
        "target_p95_ms": TARGET_P95_S * 1000,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"quanta: {sizes['quanta']:,} ({sizes['autopilot_quanta']:,} autopilot, "
        f"{sizes['ready_autopilot']:,} of them ready)  goals: {sizes['goals']:,}  "
        f"running agents: {sizes['running_agents']}"
    )
    print(f"hub: {tick.state} — {tick.reason}")
    print(f"each tick sends after commit: {', '.join(tick.sent) or 'nothing'}")
    print(f"statements per tick: {len(statements)}")
    for sql in statements:
        print(f"    {' '.join(sql.split())[:110]}")
    print(f"snapshot_take: p50 {ms(pct(snap_times, 50))}  p95 {ms(pct(snap_times, 95))}")
    print(
        f"hub_tick ({args.ticks} ticks): p50 {ms(pct(tick_times, 50))}  "
        f"p95 {ms(pct(tick_times, 95))}  (target p95 < {ms(TARGET_P95_S)})"
    )
    print(
        f"this process's CPU per tick: {ms(cpu_per_tick)}  "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
