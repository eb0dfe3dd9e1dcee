"""Durable peers of the burst manager for bench/wave_overhead.py: the same DAG per quantum
(2 sequential no-op agents -> 3 in parallel -> 1) on the same Postgres server, each engine in
a database of its own that the benchmark creates and drops, run by as many worker processes as
Celery gets.

The engines are the optional `peers` extra (`pip install -e '.[peers]'`); they are imported
only when a peer runs, through `require`, so the project's lint and tests never need them."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
AGENTS_PER_QUANTUM = 6
PEERS = ("dbos", "procrastinate")
INSTALL_HINT = "pip install -e '.[peers]'  (the optional extra in pyproject.toml)"


class PeerMissing(Exception):
    """A peer's engine is not installed."""


def require(module: str) -> ModuleType:
    """The engine's module, or PeerMissing with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PeerMissing(f"{module} is not installed: {INSTALL_HINT}") from exc


def installed(peer: str) -> bool:
    try:
        require(peer)
    except PeerMissing:
        return False
    return True


@dataclass(frozen=True)
class Machine:
    """CPU time of the whole machine (all processes: Postgres, Redis, workers, this one, and
    whatever else runs), from /proc/stat, in seconds."""

    busy: float
    total: float

    @classmethod
    def now(cls) -> Machine:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + fields[4]  # idle + iowait
        return cls(busy=(sum(fields[:8]) - idle) / hz, total=sum(fields[:8]) / hz)

    def since(self, before: Machine) -> float:
        return self.busy - before.busy


def process_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that has gone)."""
    hz = os.sysconf("SC_CLK_TCK")
    spent = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        spent += (int(fields[11]) + int(fields[12])) / hz
    return spent


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass(frozen=True)
class PeerRun:
    """One measured run: agent stages per second, machine and worker CPU per stage (ms)."""

    stages_per_s: float
    machine_ms: float
    worker_ms: float


def server_url(database: str) -> str:
    """`database` on the Postgres server of DATABASE_URL (the one the manager uses)."""
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:55432/annihilation")
    return base.rsplit("/", 1)[0] + "/" + database


@contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A new, empty database `name` on the same server (dropped first if a run left it, and
    on leaving); yields its URL."""
    import psycopg

    admin = server_url("postgres")

    def drop(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    with psycopg.connect(admin, autocommit=True) as conn:
        drop(conn)
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url(name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            drop(conn)


def start(module: str, *args: str, ready: bool = False) -> subprocess.Popen[bytes]:
    """A worker process of a peer: `bench.peers.<module>.serve(*args)` (imported by name, as the
    engines expect of the module holding their tasks). With `ready`, returns once the process
    has printed its first line (it is serving)."""
    code = f"import sys; from bench.peers.{module} import serve; serve(*sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"},
        stdout=subprocess.PIPE if ready else subprocess.DEVNULL,
    )
    if ready:
        assert proc.stdout is not None
        if not proc.stdout.readline():
            raise SystemExit(f"the {module} worker did not start (exit {proc.wait()})")
    return proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_until(done: int, count: object, *, timeout: float, what: str) -> None:
    """Poll `count()` every 20 ms until it reaches `done`."""
    assert callable(count)
    deadline = time.monotonic() + timeout
    while count() < done:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: {count()} of {done} done after {timeout:.0f} s")
        time.sleep(0.02)
