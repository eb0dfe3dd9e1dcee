"""1,000 agents waiting on the Tether at once, on one Celery worker with 4 slots.

Each agent (scripted provider) asks the Tether on its first turn and is suspended; then the
bench answers every question, at a steady rate, and each agent finishes. Prints: worker slots
held while they all wait (target 0), the worker's memory (RSS) idle / with every agent waiting /
at the end, and the time from an answer to its agent running again (its `started` event on the
worker), p50/p95/max (target p95 under 250 ms).

    python bench/tether_suspend.py [--agents 1000] [--slots 4] [--rate 20] [--workspace worktree]

Uses the dev services (make bench) with a database of its own (annihilation_bench_tether,
migrated and emptied), a temporary ANNIHILATION_HOME and its own queue. Each agent works in its
quantum's worktree, as by default (`--workspace worktree`); `--workspace shared` puts all 1,000
in one shared tree, whose single commit lock every finishing agent takes in turn (three git
commands for an agent that changed nothing): the agents then finish one at a time, and resumed
agents queue behind those commits. The answer rate printed as offered is the one reached: an
answer that takes longer than the gap between answers keeps it below the rate asked for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, pct, scratch_dir, start_worker  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--agents", type=int, default=1000)
parser.add_argument("--slots", type=int, default=4)
parser.add_argument("--rate", type=float, default=20.0, help="answers per second")
parser.add_argument(
    "--workspace", choices=["worktree", "shared"], default="worktree",
    help="a worktree per quantum (the default mode) or one tree all agents share",
)  # fmt: skip
ARGS = parser.parse_args()
WORKSPACE = ARGS.workspace

HOME = scratch_dir("annihilation-bench-tether-")
SCRIPTS = HOME / "scripts"
SCRIPTS.mkdir(parents=True)
(SCRIPTS / "bench-ask.yaml").write_text(
    """name: bench-ask
match: {labels: [bench-ask]}
turns:
  - tools:
      - ask_tether: {question: "Go on? ({agent_id})", assumption: "go on", timeout_s: 3600}
  - text: "Done."
""",
    encoding="utf-8",
)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ["ANNIHILATION_SCRIPT_DIRS"] = str(SCRIPTS)
os.environ["ANNIHILATION_WORKSPACE_MODE"] = "shared" if WORKSPACE == "shared" else "worktree"
os.environ["ANNIHILATION_PROVIDER"] = ""
os.environ["ANNIHILATION_TEXT_FLUSH_S"] = "0.5"


django_bench_db("annihilation_bench_tether")  # sets DATABASE_URL for the worker subprocess too

from django.db import connection  # noqa: E402

QUEUE = "bench-tether"
WORKER = "bench-tether"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def slots_held() -> int:
    from annihilation.celery import app

    replies = app.control.inspect(
        destination=[f"{WORKER}@{os.uname().nodename}"], timeout=2.0
    ).active()
    if not replies:
        raise SystemExit("the worker did not answer `inspect active`")
    return sum(len(tasks) for tasks in replies.values())


def wait_count(label: str, count: int, status: str, timeout: float) -> float:
    from bursts.models import AgentRun

    started = time.monotonic()
    while True:
        n = AgentRun.objects.filter(quantum__labels__contains=[label], status=status).count()
        if n >= count:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise SystemExit(f"only {n} of {count} agents reached {status} within {timeout} s")
        time.sleep(0.2)


def main() -> None:
    args = ARGS

    from annihilation.celery import app
    from core.models import Event
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.runtime.runs import agent_run_create
    from psychonauts.tasks import execute_agent_run
    from psychonauts.workspaces.worktrees import demo_repo_ensure
    from quanta.services import quantum_create
    from tether.models import Reaching, ReachingStatus
    from tether.services import reaching_answer

    app.conf.task_default_queue = QUEUE  # resumes sent by the answers go to the bench worker
    roles_sync_defaults()
    demo_repo_ensure(HOME / "repo")
    label = f"bench-{int(time.time())}"
    runs = []
    for n in range(args.agents):
        quantum = quantum_create(title=f"tether bench {n}", labels=[label, "bench-ask"])
        runs.append(agent_run_create(quantum_id=quantum.pk, role="coder", provider="scripted"))
    connection.close()

    worker = start_worker(name=WORKER, queue=QUEUE, pool="threads", concurrency=args.slots)
    try:
        idle = rss_kb(worker.pid)
        for run in runs:
            execute_agent_run.apply_async((run.pk,), queue=QUEUE)
        suspend_s = wait_count(label, args.agents, "waiting", timeout=600)
        time.sleep(0.5)
        held = slots_held()
        waiting_rss = rss_kb(worker.pid)
        reachings = list(
            Reaching.objects.filter(
                quantum__labels__contains=[label], status=ReachingStatus.PENDING
            ).values_list("pk", "agent_run_id")
        )
        print(
            f"agents waiting on the Tether: {len(reachings)} (all suspended in {suspend_s:.1f} s; "
            f"workspace: {WORKSPACE}, {args.slots} slots)"
        )
        print(f"worker slots held while they wait: {held} of {args.slots} (target 0)")
        print(f"worker RSS: idle {idle / 1024:.0f} MiB, with {args.agents} agents waiting "
              f"{waiting_rss / 1024:.0f} MiB")  # fmt: skip

        answered_at: dict[int, float] = {}
        gap = 1.0 / args.rate
        began = time.monotonic()
        for n, (reaching_id, run_id) in enumerate(reachings):
            pause = began + n * gap - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            answered_at[run_id] = time.time()
            reaching_answer(reaching_id=reaching_id, text="yes, go on", by="bench")
        # An answer that takes longer than the gap makes the rate offered lower than asked for.
        offered = len(reachings) / max(time.monotonic() - began, 1e-9)
        wait_count(label, args.agents, "done", timeout=600)
        final_rss = rss_kb(worker.pid)

        latencies: list[float] = []
        starts: dict[int, list[float]] = {}
        for run_id, created in Event.objects.filter(
            type="started", payload__agent_run_id__in=list(answered_at)
        ).values_list("payload__agent_run_id", "created_at"):
            starts.setdefault(int(run_id), []).append(created.timestamp())
        for run_id, t0 in answered_at.items():
            resumed = [t for t in starts.get(run_id, []) if t >= t0 - 0.001]
            if resumed:
                latencies.append(min(resumed) - t0)
        print(f"answered {len(answered_at)} at {args.rate:.0f}/s (offered: {offered:.0f}/s); all "
              f"done; worker RSS at the end {final_rss / 1024:.0f} MiB")  # fmt: skip
        print(
            f"answer -> agent running again ({len(latencies)} agents): "
            f"p50 {pct(latencies, 50) * 1000:.0f} ms, p95 {pct(latencies, 95) * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms (target p95 < 250 ms)"
        )
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    main()
