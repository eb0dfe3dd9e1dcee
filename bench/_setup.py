"""Shared set-up for benchmarks: a database of their own on the dev Postgres, migrated, Celery
workers started for one benchmark queue, and daphne serving the project."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


RAM_DIR = Path("/dev/shm")


def scratch_dir(prefix: str) -> Path:
    """A temporary folder, removed when the benchmark exits (its workers have stopped by then).
    In RAM (/dev/shm, tmpfs) where the machine has it, unless TMPDIR names another place: the
    benchmarks measure our code, not a disk. Creating a file, which git and an agent do some
    thirty times per agent, cost 17 us of CPU on tmpfs and 33-48 us on a journaled ext4, but
    110-970 us in /tmp on the machine of the README's figures: an ext4 without a journal, whose
    inode allocator steps over every inode deleted in the last minutes (README, Benchmarks)."""
    ram = not os.environ.get("TMPDIR") and RAM_DIR.is_dir() and os.access(RAM_DIR, os.W_OK)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=RAM_DIR if ram else None))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def filesystem(path: Path) -> str:
    """The type of the filesystem `path` is on (the longest mount point above it)."""
    target, found, fstype = path.resolve(), "", "unknown"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        if len(mount) > len(found) and target.is_relative_to(mount):
            found, fstype = mount, fields[2]
    return fstype


def file_create_us(folder: Path, count: int = 500) -> float:
    """CPU (this process) to create one small file in `folder`, mean of `count`; removed after."""
    probe = Path(tempfile.mkdtemp(prefix="create-probe-", dir=folder))
    started = time.process_time()
    for n in range(count):
        (probe / f"f{n}").write_bytes(b"x")
    spent = time.process_time() - started
    shutil.rmtree(probe)
    return spent / count * 1e6


def django_bench_db(name: str = "annihilation_bench") -> None:
    """Point Django at `name` on the dev cluster (creating it), set up, migrate and empty it."""
    sys.path.insert(0, str(ROOT))
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:55432/annihilation")
    os.environ["DATABASE_URL"] = base.rsplit("/", 1)[0] + "/" + name
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
    import psycopg

    admin_url = base.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    # Every run starts from empty tables: what earlier runs left (a million event rows after a
    # few hundred agent benchmarks) would make each run slower than the one before.
    call_command("flush", interactive=False, verbosity=0)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def start_worker(*, name: str, queue: str, pool: str, concurrency: int) -> subprocess.Popen[bytes]:
    """A Celery worker on `queue` only, started with this process's environment; returns once
    it answers a ping (and its pool has settled, so idle memory can be measured)."""
    from annihilation.celery import app

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "annihilation", "worker", "--pool", pool,
         "-c", str(concurrency), "-Q", queue, "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat", "-n", f"{name}@%h"],
        cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if app.control.ping(destination=[f"{name}@{os.uname().nodename}"], timeout=0.5):
            time.sleep(0.5)
            return worker
    worker.kill()
    raise SystemExit(f"the worker {name} did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def daphne_serving(*, start_s: float = 30.0) -> Iterator[int]:
    """daphne serving the project with this process's environment on a free port (yielded once
    /healthz answers); stopped on leaving."""
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "annihilation.asgi:application"],
        cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("daphne did not start") from None
                time.sleep(0.2)
        yield port
    finally:
        web.terminate()
        web.wait(10)
