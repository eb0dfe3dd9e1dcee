"""A cluster of hosts on this machine for black-box system tests (scripts/cluster.sh).

The test process drives the cluster through the script and `manage.py` commands run with the
cluster's environment, and reads results from the cluster's own Postgres (psycopg) and its
central repository (git on the bare repository): nothing of the cluster's state goes through
the test database. Its agents are the scripted provider playing CLUSTER_SCRIPTS: every coder
and the last tester write a note, after listing the notes the stages before them left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster.sh"
# The label every cluster quantum carries: the scripts below match it.
LABEL = "cluster"

# One script per kind of role, for quanta labelled LABEL. The planner has no tool that writes;
# the coder and the reviewing roles list the notes they see (seen/<agent>.txt) and add their own
# (notes/<agent>.md), so a commit shows what its agent saw of the stages before. SLEEP: the
# seconds of each agent's model turn.
CLUSTER_SCRIPTS = {
    "cluster-planner.yaml": """
name: cluster-planner
match: {roles: [planner], labels: [cluster]}
turns:
  - sleep: SLEEP
    text: "{agent_id}: each agent writes a note."
""",
    "cluster-coder.yaml": """
name: cluster-coder
match: {roles: [coder], labels: [cluster]}
turns:
  - tools:
      - shell: {command: "mkdir -p seen notes && ls notes > seen/{agent_id}.txt"}
  - sleep: SLEEP
    tools:
      - write_file: {path: "notes/{agent_id}.md", content: "{agent_id} of q-{quantum_id}\\n"}
  - text: "{agent_id} wrote its note."
""",
    "cluster-check.yaml": """
name: cluster-check
match: {roles: [reviewer, tester], labels: [cluster]}
turns:
  - tools:
      - shell: {command: "mkdir -p seen notes && ls notes > seen/{agent_id}.txt && echo '{agent_id} of q-{quantum_id}' > notes/{agent_id}.md"}
  - sleep: SLEEP
    tools:
      - report_verdict: {verdict: pass, reasons: "{agent_id} saw the notes before it."}
  - text: "{agent_id} passed."
""",
}


def cluster_unavailable() -> str:
    """Why no cluster can run here, or "" (it needs root and network namespaces)."""
    if os.geteuid() != 0:
        return "the cluster tests need root (network namespaces, veths): CI runs them as root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2): the cluster needs network namespaces"
    probe = f"ann-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return ""


@dataclass(frozen=True)
class AgentRow:
    agent_id: str
    attempt: int
    role: str
    status: str
    host: str
    quantum_id: int
    stage_index: int
    started_at: datetime | None
    finished_at: datetime | None


@dataclass
class Cluster:
    """A running cluster: its environment, database and central repository."""

    home: Path
    env: dict[str, str]
    hosts: list[str]
    tmp: Path
    waves: list[int] = field(default_factory=list)

    # --- driving it ---

    def sh(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            [str(SCRIPT), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, f"cluster.sh {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def manage(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        proc = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"manage.py {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
        return proc.stdout

    def quanta_add(self, tag: str, count: int) -> list[int]:
        """`count` quanta labelled LABEL and `tag` (the default pipeline takes them)."""
        path = self.tmp / f"{tag}.yaml"
        path.write_text(
            "".join(
                f"- title: {tag} quantum {i}\n  body: every agent writes a note\n"
                f"  labels: [{LABEL}, {tag}]\n  priority: 2\n"
                for i in range(count)
            )
        )
        self.manage("quanta", "import", str(path))
        rows = self.query(
            "SELECT id FROM quanta_quantum WHERE labels @> ARRAY[%s]::varchar[] ORDER BY id", tag
        )
        return [int(r[0]) for r in rows]

    def wave_start(self, tag: str) -> int:
        out = self.manage("start_wave", "--label", tag, "--json")
        wave_id = int(json.loads(out)["wave_id"])
        self.waves.append(wave_id)
        return wave_id

    def wave_wait(self, wave_id: int, timeout: float = 150) -> dict[str, Any]:
        """The wave's `waves show --json` once it ended (failing the test after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.query("SELECT status FROM bursts_wave WHERE id = %s", wave_id)[0][0]
            if status in ("done", "failed", "cancelled"):
                detail: dict[str, Any] = json.loads(
                    self.manage("waves", "show", str(wave_id), "--json")
                )
                return detail
            time.sleep(0.5)
        raise AssertionError(f"wave {wave_id} still running after {timeout} s:\n{self.logs_tail()}")

    def hosts_answering(self, timeout: float = 40) -> None:
        """Until every host's worker answers a ping."""
        deadline = time.monotonic() + timeout
        wanted = {f"worker@{h}" for h in self.hosts}
        answered: set[str] = set()
        while time.monotonic() < deadline:
            proc = subprocess.run(
                [str(ROOT / ".venv" / "bin" / "celery"), "-A", "annihilation", "inspect", "ping",
                 "-t", "1", "--json"],
                cwd=ROOT, env=self.env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            with contextlib.suppress(json.JSONDecodeError):
                # {"worker@h1": {"ok": "pong"}, ...}
                answered = set(json.loads(proc.stdout or "{}"))
            if wanted <= answered:
                return
            time.sleep(0.5)
        raise AssertionError(f"hosts not answering: {sorted(wanted - answered)}")

    def hosts_restore(self) -> None:
        """Every host on the network with its worker answering (after a kill or a cut)."""
        for host in self.hosts:
            self.sh("heal", host)
            self.sh("start", host)
        self.hosts_answering()

    def logs_tail(self, lines: int = 30) -> str:
        parts = []
        for log in sorted((self.home / "logs").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # --- reading it ---

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.env["DATABASE_URL"], autocommit=True) as conn:
            return list(conn.execute(sql, params).fetchall())

    def agents(self, quantum_ids: Sequence[int]) -> list[AgentRow]:
        rows = self.query(
            "SELECT agent_id, attempt, role, status, worker, quantum_id, stage_index, "
            "started_at, finished_at FROM bursts_agentrun WHERE quantum_id = ANY(%s) "
            "ORDER BY quantum_id, stage_index, agent_id, attempt",
            list(quantum_ids),
        )
        return [
            AgentRow(
                agent_id=r[0],
                attempt=r[1],
                role=r[2],
                status=r[3],
                # The worker column starts with the host (ANNIHILATION_HOST): "h2:pid:thread".
                host=str(r[4]).split(":", 1)[0],
                quantum_id=r[5],
                stage_index=r[6],
                started_at=r[7],
                finished_at=r[8],
            )
            for r in rows
        ]

    def running_on(self, host: str, quantum_ids: Sequence[int]) -> list[AgentRow]:
        return [a for a in self.agents(quantum_ids) if a.status == "running" and a.host == host]

    @property
    def bare(self) -> Path:
        return self.home / "git" / "central.git"

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", *args], cwd=self.bare, capture_output=True, text=True, check=check
        )

    def tip(self, ref: str) -> str:
        return self.git("rev-parse", "--verify", "--quiet", ref, check=False).stdout.strip()

    def commits(self, quantum_id: int) -> list[tuple[str, str]]:
        """(sha, subject) of the quantum's branch in the central repository, oldest first."""
        branch = f"annihilation/q-{quantum_id}"
        if not self.tip(branch):
            return []
        out = self.git("log", "--reverse", "--format=%H %s", f"main..{branch}").stdout
        return [(line[:40], line[41:]) for line in out.splitlines()]


def cluster_env(home: Path, scripts: Path, **settings: str) -> dict[str, str]:
    """The environment the cluster's processes get (and `env` prints, for manage.py)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANNIHILATION_", "DATABASE_URL", "REDIS_URL", "DJANGO_"))
    }
    env.update(
        CLUSTER_HOME=str(home),
        # Its own bridge, subnet, ports and names: a cluster of the operator's (the benchmark's
        # defaults) may run meanwhile.
        CLUSTER_NET="10.232.0",
        CLUSTER_BRIDGE="anntb0",
        CLUSTER_NS_PREFIX="annt-",
        CLUSTER_PG_PORT="55441",
        CLUSTER_REDIS_PORT="56391",
        CLUSTER_GIT_PORT="59419",
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
        **settings,
    )
    return env


def scripts_write(folder: Path, *, sleep: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CLUSTER_SCRIPTS.items():
        (folder / name).write_text(text.replace("SLEEP", str(sleep)).lstrip())
    return folder


@contextlib.contextmanager
def cluster_running(
    tmp: Path, *, hosts: int, sleep: float, concurrency: int = 4, **settings: str
) -> Iterator[Cluster]:
    """`scripts/cluster.sh up` with these settings; `down` at the end, whatever happened. Its
    home is in the checkout (CLUSTER_HOME, made afresh by `up` but for the Postgres cluster):
    the `postgres` user must reach it, which a private temporary folder does not allow."""
    home = ROOT / ".annihilation-cluster-test"
    env = cluster_env(
        home,
        scripts_write(tmp / "scripts", sleep=sleep),
        CLUSTER_CONCURRENCY=str(concurrency),
        **settings,
    )
    cluster = Cluster(home=home, env=env, hosts=[f"h{k}" for k in range(1, hosts + 1)], tmp=tmp)
    try:
        cluster.sh("up", str(hosts), timeout=180)
        # manage.py calls talk to the cluster as its control host.
        for line in cluster.sh("env").splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        cluster.hosts_answering()
        yield cluster
    finally:
        subprocess.run(
            [str(SCRIPT), "down"], env=env, capture_output=True, timeout=120, check=False
        )


def skip_unless_cluster() -> None:
    reason = cluster_unavailable()
    if reason:
        pytest.skip(reason)
