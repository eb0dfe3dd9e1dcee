"""100 agents at once on one Celery worker against a slow fake LLM (each call sleeps 1 s).

Prints: wall time of 100 concurrent agents vs one agent doing the same number of turns (target
under 1.5x), CPU by process, memory per concurrent agent (worker RSS growth / agents), tool-call
overhead per turn, one realistic model call's CPU against the SDK's typed method, and the same
load on a prefork worker, which is why agents run on the threads pool (--prefork 0: skipped).

    python bench/agents_concurrency.py [--agents 100] [--turns 3] [--prefork 8] [--no-shell]
Uses the dev services (make bench) with a database of its own (annihilation_bench, migrated and
emptied), a temporary ANNIHILATION_HOME (the target repository and its worktrees; in RAM where the
machine has /dev/shm, see bench/_setup.scratch_dir) and its own Celery queue; the demo's data is
never touched.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import (  # noqa: E402
    django_bench_db,
    file_create_us,
    filesystem,
    scratch_dir,
    start_worker,
)

HOME = scratch_dir("annihilation-bench-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ["ANTHROPIC_API_KEY"] = "bench"
os.environ["ANNIHILATION_TEXT_FLUSH_S"] = "0.5"
# Production settings, here and in the worker (which inherits them): DEBUG on wraps every query
# in Django's debug cursor, which logs it. `DEBUG=true` in the environment measures development.
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # a strong one: DEBUG is off

django_bench_db("annihilation_bench_agents")  # sets DATABASE_URL for the worker subprocesses too

from django.core.management import call_command  # noqa: E402

from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server  # noqa: E402

QUEUE = "bench-agents"


def slow_llm(turns: int, shell: bool) -> Callable[[dict[str, Any]], FakeReply]:
    """Each turn but the last writes a file and (with `shell`) runs one shell command on it, in
    the agent sandbox as every agent's command is."""

    def reply(body: dict[str, Any]) -> FakeReply:
        index = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if index < turns - 1:
            path = f"bench/{abs(hash(str(body['messages'][0]['content']))) % 10**8}-{index}.txt"
            uses: list[tuple[str, dict[str, Any]]] = [
                ("write_file", {"path": path, "content": "x" * 200})
            ]
            if shell:
                uses.append(("shell", {"command": f"wc -c {path}"}))
            return FakeReply(text=f"turn {index}", tool_uses=uses, delay_s=1.0)
        return FakeReply(text="all done", delay_s=1.0)

    return reply


def _serve_fake(turns: int, shell: bool, conn: Connection) -> None:
    with fake_anthropic_server(slow_llm(turns, shell)) as fake:
        conn.send(fake.base_url)
        threading.Event().wait()


@contextmanager
def fake_llm_process(turns: int, shell: bool) -> Iterator[tuple[str, int]]:
    """The slow fake LLM in a process of its own (forked): it stands for a remote service, so
    its CPU is not the bench's and is counted apart. Yields its base URL and pid."""
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    server = context.Process(target=_serve_fake, args=(turns, shell, child), daemon=True)
    server.start()
    try:
        yield parent.recv(), server.pid or 0
    finally:
        server.kill()
        server.join()


def tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants (prefork children included)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            # The pool's processes are forked by the main thread; agent threads fork only git.
            todo.extend(int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process, its live descendants and the children it has
    reaped (git subprocesses, exited Postgres backends)."""
    hz = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / hz
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def user_sys_s(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def children_cpu_s(pid: int) -> float:
    """CPU seconds of the children a process has reaped (the worker's git subprocesses)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def service_pid(name: str, port: int) -> int | None:
    """The Postgres postmaster or Redis server listening on `port` (found by command line)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if name in cmd.split(" ", 1)[0] and (f"-p {port}" in cmd or f":{port}" in cmd):
            return int(proc.name)
    return None


def speed_probe_s() -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this machine computes at the moment
    (the batch is CPU-bound while the single agent mostly waits). The scratch folder's disk is
    measured apart (file_create_us): on the README's machine it, not this figure, explained
    the runs that drifted."""
    started = time.process_time()
    sum(i * i for i in range(3_000_000))
    return time.process_time() - started


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy so far (from /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_batch(count: int, worker_pid: int) -> tuple[float, int, list[int]]:
    """Enqueue `count` agent runs at once; returns wall time, peak RSS (kB) and run ids."""
    from bursts.models import AGENT_TERMINAL, AgentRun, AgentStatus
    from psychonauts.runtime.runs import agent_run_create
    from psychonauts.tasks import execute_agent_run
    from quanta.services import quantum_create

    runs = []
    for n in range(count):
        q = quantum_create(title=f"bench agent {n}", labels=["bench"])
        runs.append(agent_run_create(quantum_id=q.pk, role="coder", provider="anthropic"))
    ids = [r.pk for r in runs]
    # The harness must not compete for the CPU it measures: memory is sampled four times a
    # second, and the end is one query on the runs every 50 ms (the task's outcome is the
    # AgentRun row; it keeps no Celery result).
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_kb(worker_pid))
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    for run_id in ids:
        execute_agent_run.apply_async((run_id,), queue=QUEUE)
    finished = AgentRun.objects.filter(pk__in=ids, status__in=AGENT_TERMINAL)
    while finished.count() < count:
        if time.monotonic() - started > 600:
            raise SystemExit("the agents did not finish within 10 minutes")
        time.sleep(0.05)
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    bad = list(
        AgentRun.objects.filter(pk__in=ids)
        .exclude(status=AgentStatus.DONE)
        .values_list("status", "error")
    )
    if bad:
        raise SystemExit(f"{len(bad)} agents did not finish: {bad[:3]}")
    return wall, peak[0], ids


def finished_sweep(agent_run_ids: list[int]) -> None:
    from bursts.models import AgentRun
    from psychonauts.runtime.sweep import workspaces_sweep
    from quanta.services import quantum_close

    for quantum_id in AgentRun.objects.filter(pk__in=agent_run_ids).values_list(
        "quantum_id", flat=True
    ):
        quantum_close(quantum_id=quantum_id, reason="bench: the agent finished")
    workspaces_sweep()


def tool_call_s(count: int = 200) -> float:
    """What one tool call costs the loop beyond the tool: a write_file, recorded pending and
    then done, timed alone in this process (median)."""
    from psychonauts.models import ToolCall
    from psychonauts.runtime.checkpoint import tool_call_done
    from psychonauts.runtime.runs import agent_run_create
    from psychonauts.runtime.tools import ToolContext, tool_execute
    from psychonauts.workspaces.worktrees import workspace_ensure
    from quanta.services import quantum_create

    quantum = quantum_create(title="bench tool calls", labels=["bench"])
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    ctx = ToolContext(
        agent_run_id=run.pk, agent_id=run.agent_id, attempt=1, quantum_id=quantum.pk,
        role="coder", depth=0, workspace=workspace_ensure(quantum_id=quantum.pk), shared=False,
    )  # fmt: skip
    samples = []
    for n in range(count):
        args = {"path": f"bench/tool-{n}.txt", "content": "x" * 200}
        started = time.perf_counter()
        call = ToolCall.objects.create(
            agent_run=run, turn_index=n, tool_use_id=f"t{n}", name="write_file", input=args
        )
        result = tool_execute(ctx, "write_file", args, [])
        tool_call_done(call_id=call.pk, output=result.output, is_error=result.is_error,
                       duration_ms=0)  # fmt: skip
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def provider_call_ms(count: int = 40) -> tuple[float, float]:
    """CPU of one realistic model call in the calling thread (median): the provider's, and the
    SDK's typed `messages.create(stream=True)` on the same request as the baseline. The request
    is a conversation of 20 tool turns (62 KB, with the coder's 15 tools); the answer is 2,000
    characters streamed in 16-character deltas and a tool call, from a fake in this process."""
    import anthropic

    from psychonauts.routing.providers.anthropic import AnthropicProvider
    from psychonauts.routing.providers.base import Message, ProviderRequest, RunInfo
    from psychonauts.runtime.tools import tools_for

    messages: list[Message] = [{"role": "user", "content": "Make the tests pass. " * 50}]
    for n in range(20):
        use = {"type": "tool_use", "id": f"t{n}", "name": "read_file", "input": {"path": "a.py"}}
        messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": "Next. " * 80}, use]}
        )
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{n}", "content": "a line of code\n" * 130}
        ]})  # fmt: skip
    request = ProviderRequest(
        model="claude-sonnet-4-6", system="You are a careful coder. " * 40, messages=messages,
        tools=[t.spec() for t in tools_for([])],  # all 15, as the coder has
        max_tokens=4096, run=RunInfo(agent_run_id=0, agent_id="bench", role="coder", attempt=1,
                                     quantum_id=0),
    )  # fmt: skip
    answer = FakeReply(text="word " * 400, tool_uses=[("write_file", {"path": "a.txt", "content": "x" * 2000})])  # fmt: skip
    with fake_anthropic_server(lambda body: answer) as fake:
        client = anthropic.Anthropic(base_url=fake.base_url, api_key="bench", max_retries=0)
        provider = AnthropicProvider(client)

        def ours() -> None:
            provider.complete(request, lambda text: None)

        def typed() -> None:
            with client.messages.create(
                model=request.model, max_tokens=request.max_tokens, system=request.system,
                messages=cast(Any, request.messages), tools=cast(Any, request.tools), stream=True,
            ) as stream:  # fmt: skip
                for _event in stream:
                    pass

        def median_ms(call: Callable[[], None]) -> float:
            samples = []
            for _ in range(count):
                started = time.thread_time()
                call()
                samples.append(time.thread_time() - started)
            return statistics.median(samples) * 1000

        median_ms(ours), median_ms(typed)  # warm both
        return median_ms(ours), median_ms(typed)


def compare_prefork(processes: int, agents: int, threads_wall: float, threads_peak: int) -> None:
    """The same agents on a prefork worker of `processes`: why agents run on the threads pool."""
    prefork_n = min(processes * 2, agents)
    worker = start_worker(name="bench-prefork", queue=QUEUE, pool="prefork", concurrency=processes)
    try:
        idle_p = tree_rss_kb(worker.pid)
        wall_p, peak_p, _ = run_batch(prefork_n, worker.pid)
    finally:
        worker.terminate()
        worker.wait()
    print(f"\n== prefork pool, {processes} processes, {prefork_n} agents")
    print(f"wall                  : {wall_p:6.2f} s ({prefork_n / wall_p:.1f} agents/s vs "
          f"threads {agents / threads_wall:.1f} agents/s)")  # fmt: skip
    per_proc = peak_p / 1024 / (processes + 1)
    print(f"worker RSS idle / peak: {idle_p / 1024:6.1f} MB / {peak_p / 1024:.1f} MB "
          f"({per_proc:.1f} MB per process)")  # fmt: skip
    print(
        f"{agents} concurrent agents would need {agents} processes "
        f"≈ {per_proc * agents / 1024:.1f} GB vs {threads_peak / 1024:.0f} MB on threads"
    )
    print(
        "\n=> agents are I/O-bound (waiting on the LLM): run them on "
        "`celery worker --pool threads -c 100`."
    )


def main() -> None:
    from core.cli import non_negative_int, positive_int

    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=positive_int, default=100)
    parser.add_argument("--turns", type=positive_int, default=3)
    parser.add_argument(
        "--prefork", type=non_negative_int, default=8, help="prefork processes to compare (0: none)"
    )
    parser.add_argument(
        "--no-shell", dest="shell", action="store_false",
        help="turns only write a file (by default each also runs one sandboxed shell command)",
    )  # fmt: skip
    args = parser.parse_args()

    from django.conf import settings
    from redis import Redis

    from bursts.models import AgentRun
    from psychonauts.models import AgentTurn
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.workspaces.worktrees import demo_repo_ensure

    call_command("migrate", verbosity=0)
    pg_port = int(settings.DATABASES["default"]["PORT"])
    redis_port = int(Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs["port"])
    roles_sync_defaults()
    demo_repo_ensure(HOME / "repo")

    from psychonauts.containment.sandbox import sandbox_status

    with fake_llm_process(args.turns, args.shell) as (base_url, fake_pid):
        os.environ["ANTHROPIC_BASE_URL"] = base_url
        print(f"fake LLM at {base_url}: each call sleeps 1 s; {args.turns} turns per agent")
        tools = "write_file + one shell command" if args.shell else "write_file"
        print(f"each turn but the last: {tools}; sandbox {sandbox_status().describe()}")
        print(f"scratch folder: {HOME} ({filesystem(HOME)}; creating a file there costs "
              f"{file_create_us(HOME):.0f} us of CPU; TMPDIR=... to run elsewhere)")  # fmt: skip

        launched = time.monotonic()
        worker = start_worker(
            name="bench-threads", queue=QUEUE, pool="threads", concurrency=args.agents
        )
        # Until it answers a ping (then half a second): its warm-up (core/celery.py) included.
        ready_s = time.monotonic() - launched - 0.5
        try:
            idle = tree_rss_kb(worker.pid)
            # A fresh worker has warmed up (its threads, pooled connections, model clients and
            # sandbox made before its first task); what it still pays once is in its first
            # batch: the measured one runs on threads that have worked before, as in a worker
            # that has been up for a while.
            cold, _, cold_ids = run_batch(args.agents, worker.pid)
            # Finished work is cleaned up as the burst manager and the beat would (quanta
            # closed, their worktrees swept): git's worktree add slows with each one registered.
            finished_sweep(cold_ids)
            single, _, single_ids = run_batch(1, worker.pid)
            finished_sweep(single_ids)
            pids = {
                "postgres": service_pid("postgres", pg_port),
                "redis": service_pid("redis", redis_port),
                "fake LLM": fake_pid,
            }
            before = {name: tree_cpu_s(pid) for name, pid in pids.items() if pid}
            cpu_before, git_before = tree_cpu_s(worker.pid), children_cpu_s(worker.pid)
            us_before = user_sys_s(worker.pid)
            probe = speed_probe_s()
            bench_before, busy_before = time.process_time(), machine_busy_s()
            wall, peak, ids = run_batch(args.agents, worker.pid)
            cpu = tree_cpu_s(worker.pid) - cpu_before
            git_cpu = children_cpu_s(worker.pid) - git_before
            us = [a - b for a, b in zip(user_sys_s(worker.pid), us_before, strict=True)]
            bench_cpu, busy = time.process_time() - bench_before, machine_busy_s() - busy_before
            services_cpu = {name: tree_cpu_s(pids[name]) - v for name, v in before.items()}  # type: ignore[arg-type]
        finally:
            worker.terminate()
            worker.wait()

        turns = AgentTurn.objects.filter(agent_run_id__in=ids).count()
        runs = AgentRun.objects.filter(pk__in=ids)
        spans = [
            (r.finished_at - r.started_at).total_seconds()
            for r in runs.only("started_at", "finished_at")
            if r.finished_at and r.started_at
        ]
        llm_s = args.turns * 1.0
        own = cpu - git_cpu
        print(f"\n== threads pool, concurrency {args.agents}")
        print(
            f"single agent          : {single:6.2f} s wall ({args.turns} turns, {llm_s:.0f} s of LLM)"
        )
        print(f"{args.agents} agents at once   : {wall:6.2f} s wall")
        print(
            f"ratio                 : {wall / single:6.2f}x the single-agent time (target < 1.5x)"
        )
        print(f"  (the first batch, on a fresh worker's threads: {cold:.2f} s = "
              f"{cold / single:.2f}x; the worker answered {ready_s:.2f} s after it was "
              "launched, its warm-up included)")  # fmt: skip
        print(
            f"worker CPU            : {own:6.2f} s for {args.agents} agents = "
            f"{own / args.agents * 1000:.0f} ms per agent, "
            f"{own / args.agents / args.turns * 1000:.0f} ms per turn (one process: the GIL; "
            "without its git subprocesses)"
        )
        print(
            f"CPU by process        : worker {own:.2f} s (user {us[0]:.2f}, system "
            f"{us[1]:.2f}) + its git {git_cpu:.2f} s, "
            + ", ".join(f"{name} {v:.2f} s" for name, v in services_cpu.items())
            + f", bench {bench_cpu:.2f} s; machine busy {busy:.2f} s of "
            f"{wall * (os.cpu_count() or 1):.2f} s ({os.cpu_count()} cores x wall)"
        )
        print(f"machine speed probe   : {probe:6.3f} s (a fixed pure-Python loop just before the "
              "batch; larger = slower machine)")  # fmt: skip
        print(f"worker RSS idle / peak: {idle / 1024:6.1f} MB / {peak / 1024:.1f} MB")
        print(f"memory per agent      : {(peak - idle) / 1024 / args.agents:6.2f} MB")
        per_turn = (statistics.mean(spans) - llm_s) / args.turns
        print(f"turns checkpointed    : {turns} ({turns / args.agents:.1f} per agent)")
        print(
            f"tool call             : {tool_call_s() * 1000:6.2f} ms (write_file with its two "
            "rows: the pending call and its result; one agent alone, median of 200)"
        )
        print(f"runtime overhead/turn : {per_turn * 1000:6.1f} ms (agent span - LLM time) / turns,"
              f" under {args.agents}-way contention")  # fmt: skip
        ours, typed = provider_call_ms()
        print(f"model call CPU        : {ours:6.2f} ms vs {typed:.2f} ms through the SDK's typed "
              f"messages.create = {ours / typed:.2f}x (62 KB conversation, 2,000-character "
              "answer; median of 40)")  # fmt: skip

        if args.prefork:
            compare_prefork(args.prefork, args.agents, wall, peak)


if __name__ == "__main__":
    main()
