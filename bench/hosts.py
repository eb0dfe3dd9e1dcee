"""100 agents on 1, 2 and 3 hosts (scripts/cluster.sh: network namespaces on this machine).

Each agent is a single-stage quantum whose coder waits 1 s for a fake model (the scripted
provider's `sleep:`), writes a note and ends: its commit is pushed to the central repository
(git daemon) as on real hosts. Every host runs one worker with the same concurrency (-c), so
three hosts have three times the agent slots: for this I/O-bound load the throughput should
scale with the hosts (target: at least 2.5x on 3 hosts against 1) with no quantum lost. The
hosts share this machine's cores: at the default -c 2 three hosts keep them a little over half
busy (each agent costs ~0.2 s of git and Python), so the load stays bound by the model's wait;
at -c 4 three hosts nearly fill 2 cores and the figure measures the machine instead.

    sudo python bench/hosts.py [--agents 100] [--concurrency 2] [--sleep 1.0] [--json]

Prints the throughput (agents/s) per host count, the scaling factor (3 hosts against 1) and
how many quanta did not complete; --json prints one object with `rounds`, `scaling` and
`lost`. Runs as root (network namespaces). Uses a cluster of its own (CLUSTER_HOME, default in
RAM, see bench/_setup.scratch_dir; the script's default bridge and ports), up once for all
rounds: a round stops the workers it does not use. `scripts/cluster.sh down` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._setup import scratch_dir  # noqa: E402

SCRIPT = ROOT / "scripts" / "cluster.sh"
PYTHON = ROOT / ".venv" / "bin" / "python"
LABEL = "hostbench"
HOSTS = (1, 2, 3)

PIPELINE = f"""
name: hostbench
description: one coder (bench/hosts.py)
match:
  labels: [{LABEL}]
stages:
  - name: implement
    agents: [coder]
"""
CODER = f"""
name: hostbench-coder
match: {{roles: [coder], labels: [{LABEL}]}}
turns:
  - sleep: SLEEP
    tools:
      - write_file: {{path: "notes/{{agent_id}}.md", content: "{{agent_id}}\\n"}}
  - text: "{{agent_id}} wrote its note."
"""


class Round(TypedDict):
    hosts: int
    agents: int
    seconds: float
    per_s: float
    lost: int
    cpu_s_per_agent: float  # the machine's busy CPU (all processes) during the round / agents
    cluster_cpu_s_per_agent: float  # the cluster's own processes' CPU during the round / agents


def cpu_busy_s() -> float:
    """Seconds of CPU the machine spent busy since boot (every core; /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds of the process and its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")


def cluster_cpu_s(home: Path) -> float:
    """CPU seconds of the cluster's processes (workers, beat, git daemon, Postgres, Redis) and
    every descendant: a child that ended is in its parent's reaped-children time."""
    roots = set()
    for pidfile in [*(home / "run").glob("*.pid"), *(home / "services").rglob("*.pid")]:
        first = pidfile.read_text().split("\n", 1)[0].strip()
        if first.isdigit():
            roots.add(int(first))
    for pg in Path("/var/tmp").glob("annihilation-pg-*/postmaster.pid"):
        if str(home) in (pg.parent / "postmaster.opts").read_text(errors="replace"):
            roots.add(int(pg.read_text().split("\n", 1)[0]))
    procs: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                procs[int(entry.name)] = _stat(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    total = 0.0
    for pid, (_, cpu) in procs.items():
        ancestor = pid
        while ancestor in procs and ancestor not in roots and ancestor > 1:
            ancestor = procs[ancestor][0]
        if ancestor in roots:
            total += cpu
    return total


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def cluster(env: dict[str, str], *args: str) -> str:
    return run([str(SCRIPT), *args], env)


def manage(env: dict[str, str], *args: str) -> str:
    return run([str(PYTHON), "manage.py", *args], env)


def answering(env: dict[str, str]) -> set[str]:
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "celery"), "-A", "annihilation", "inspect", "ping",
         "-t", "1", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        return set(json.loads(proc.stdout or "{}"))
    except json.JSONDecodeError:
        return set()


def hosts_use(env: dict[str, str], n: int) -> None:
    """Workers on h1..hn only, each answering."""
    for k in HOSTS:
        cluster(env, "start" if k <= n else "stop", f"h{k}")
    wanted = {f"worker@h{k}" for k in range(1, n + 1)}
    deadline = time.monotonic() + 90
    while answering(env) != wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"workers {sorted(wanted)} did not answer")
        time.sleep(0.5)


def one_round(env: dict[str, str], tmp: Path, n: int, agents: int) -> Round:
    tag = f"{LABEL}-{n}"
    backlog = tmp / f"{tag}.yaml"
    backlog.write_text(
        "".join(
            f"- title: {tag} agent {i}\n  labels: [{LABEL}, {tag}]\n  priority: 2\n"
            for i in range(agents)
        )
    )
    manage(env, "quanta", "import", str(backlog))
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        busy, own = cpu_busy_s(), cluster_cpu_s(Path(env["CLUSTER_HOME"]))
        started = time.monotonic()
        wave_id = json.loads(manage(env, "start_wave", "--label", tag, "--json"))["wave_id"]
        deadline = started + 30 + 10 * agents
        while True:
            row = conn.execute("SELECT status FROM bursts_wave WHERE id = %s", [wave_id]).fetchone()
            if row and row[0] in ("done", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # The wave's own span (its row's start to its end): what the hosts did, without the
        # start-up of the `manage.py start_wave` process.
        span = conn.execute(
            "SELECT extract(epoch FROM finished_at - started_at) FROM bursts_wave WHERE id = %s",
            [wave_id],
        ).fetchone()
        seconds = float(span[0]) if span and span[0] is not None else time.monotonic() - started
        cpu, cluster = cpu_busy_s() - busy, cluster_cpu_s(Path(env["CLUSTER_HOME"])) - own
        closed = conn.execute(
            "SELECT count(*) FROM quanta_quantum WHERE labels @> ARRAY[%s]::varchar[] "
            "AND status = 'closed'",
            [tag],
        ).fetchone()
    done = int(closed[0]) if closed else 0
    return Round(
        hosts=n,
        agents=agents,
        seconds=round(seconds, 2),
        per_s=round(done / seconds, 2),
        lost=agents - done,
        cpu_s_per_agent=round(cpu / agents, 3),
        cluster_cpu_s_per_agent=round(cluster / agents, 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2, help="each host's worker threads")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds of each model turn")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/hosts.py runs as root (network namespaces)")

    tmp = scratch_dir("annihilation-hosts-")
    tmp.chmod(0o755)  # the cluster's Postgres runs as the `postgres` user
    scripts = tmp / "scripts"
    scripts.mkdir()
    (scripts / "hostbench-coder.yaml").write_text(CODER.replace("SLEEP", str(args.sleep)))
    (tmp / "hostbench.yaml").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANNIHILATION_")}
    env.update(
        CLUSTER_HOME=os.environ.get("CLUSTER_HOME", str(tmp / "cluster")),
        CLUSTER_CONCURRENCY=str(args.concurrency),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
        DEBUG="false",
        SECRET_KEY="bench-hosts-" + "x" * 50,
        LOG_LEVEL="WARNING",
    )
    rounds: list[Round] = []
    try:
        cluster(env, "up", str(max(HOSTS)))
        for line in cluster(env, "env").splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        manage(env, "pipelines", "load", str(tmp / "hostbench.yaml"))
        for n in HOSTS:
            hosts_use(env, n)
            rounds.append(one_round(env, tmp, n, args.agents))
            if not args.json:
                r = rounds[-1]
                print(
                    f"{n} host(s) x -c {args.concurrency}: {r['agents']} agents in "
                    f"{r['seconds']:.1f} s = {r['per_s']:.1f} agents/s, lost {r['lost']}; "
                    f"CPU per agent {r['cluster_cpu_s_per_agent']:.2f} s (cluster), "
                    f"{r['cpu_s_per_agent']:.2f} s (machine, {os.cpu_count()} cores)",
                    flush=True,
                )
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, check=False)
    scaling = rounds[-1]["per_s"] / rounds[0]["per_s"] if rounds[0]["per_s"] else 0.0
    lost = sum(r["lost"] for r in rounds)
    result: dict[str, Any] = {
        "agents": args.agents,
        "concurrency": args.concurrency,
        "sleep_s": args.sleep,
        "rounds": rounds,
        "scaling": round(scaling, 2),
        "lost": lost,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"scaling 3 hosts / 1 host: {scaling:.2f}x (target >= 2.5x); quanta lost: {lost}")


if __name__ == "__main__":
    main()
