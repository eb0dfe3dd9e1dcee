"""`make dev` from a shell with nothing activated: web, worker, beat and Flower all come up, and
a Ctrl-C (SIGINT to make's process group) stops every one of them.

It runs `make dev` itself, with the venv's bin off the PATH, on ports of its own for the web and
Flower, against the test suite's Postgres (a database of its own) and Redis (a db number of its
own), so it collides neither with a developer's `make dev` nor with the rest of the suite.
`make services` finds the test services already running (DEV_SERVICES_HOME) and starts nothing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis
from celery import Celery

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "annihilation_makedev"
REDIS_DB = 13  # used by no other test
READY_S = 90.0  # a 2-core machine migrates, then starts four Django processes at once
STOP_S = 60.0
MARKER = "ANNIHILATION_MAKE_DEV_TEST"  # every process `make dev` starts inherits it

pytestmark = pytest.mark.slow


# The test services (the Makefile's TEST_ENV), whatever database and Redis db the suite uses.
PG_URL = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:55433/annihilation"
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:56380/0"


def with_path(url: str, path: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=path))


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, all different (each held until the last is picked)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate: Callable[[], Any], what: str, alive: Callable[[], None]) -> Any:
    deadline = time.monotonic() + READY_S
    while True:
        alive()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {READY_S:.0f} s waiting for {what}")
        time.sleep(0.5)


def services_home(pg_url: str) -> Path:
    """The ANNIHILATION_HOME scripts/services.sh started the test Postgres with: given it,
    `make services` says "already running" instead of starting a second cluster."""
    with psycopg.connect(with_path(pg_url, "/postgres"), autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    data = Path(row[0])
    candidates = (
        [Path(os.environ["ANNIHILATION_HOME"])] if "ANNIHILATION_HOME" in os.environ else []
    )
    candidates.append(ROOT / ".annihilation-test")
    for home in candidates:
        # As root the cluster may live under /var/tmp (scripts/services.sh, choose_pg_data).
        digest = hashlib.md5(str(home).encode()).hexdigest()[:12]
        if data in (home / "pg", Path(f"/var/tmp/annihilation-pg-{digest}")):
            return home
    pytest.fail(
        f"the test Postgres ({data}) was not started by scripts/services.sh from {candidates}"
    )


def ensure_database(pg_url: str, name: str) -> None:
    with psycopg.connect(with_path(pg_url, "/postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def marked_processes(token: str) -> dict[int, str]:
    """Every live process (not a zombie) whose environment carries this run's marker."""
    needle = f"{MARKER}={token}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[int(entry.name)] = cmdline.strip()
    return found


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def http_status(url: str, auth: tuple[str, str] | None = None) -> int | None:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=5) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, TimeoutError):  # not listening yet
        return None


@dataclass
class MakeDev:
    proc: subprocess.Popen[bytes]
    log: Path
    token: str
    web_port: int
    flower_port: int
    flower_auth: tuple[str, str]
    redis_url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"make dev exited ({self.proc.returncode}):\n{self.output()}")


@pytest.fixture
def make_dev(tmp_path: Path) -> Iterator[MakeDev]:
    ensure_database(PG_URL, DATABASE)
    redis_url = with_path(REDIS_URL, f"/{REDIS_DB}")
    redis.Redis.from_url(redis_url).flushdb()  # this test's own db: a previous run's queue
    redis_port = urlsplit(REDIS_URL).port or 6379
    token = uuid.uuid4().hex
    web_port, flower_port = free_ports(2)
    flower_auth = ("makedev", uuid.uuid4().hex)
    log = tmp_path / "make-dev.log"
    # A login shell's PATH (root's on Debian: scripts/services.sh needs runuser from sbin).
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert str(ROOT / ".venv") not in path
    env = {
        "PATH": path,
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "LANG": "C.UTF-8",
        "DATABASE_URL": with_path(PG_URL, f"/{DATABASE}"),
        "REDIS_URL": redis_url,
        "DEBUG": "true",
        "WEB_PORT": str(web_port),
        "FLOWER_PORT": str(flower_port),
        "ANNIHILATION_FLOWER_USER": flower_auth[0],
        "ANNIHILATION_FLOWER_PASSWORD": flower_auth[1],
        "ANNIHILATION_FLOWER_URL": f"http://127.0.0.1:{flower_port}",
        "PYTHONUNBUFFERED": "1",
        MARKER: token,
    }
    home = tmp_path / "home"
    command = [
        "make", "--no-print-directory",
        # The venv pytest runs from is installed: no `pip install -e` into it from here, even
        # when pyproject.toml is newer than the venv's stamp.
        "-o", ".venv/.installed",
        "dev",
        f"DEV_HOME={home}",
        f"DEV_SERVICES_HOME={services_home(PG_URL)}",
        f"DEV_PG_PORT={urlsplit(PG_URL).port}",
        f"DEV_REDIS_PORT={redis_port}",
    ]  # fmt: skip
    with log.open("wb") as out:
        # Its own session, as a terminal's foreground job: a Ctrl-C reaches make and honcho.
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    run = MakeDev(proc, log, token, web_port, flower_port, flower_auth, redis_url)
    try:
        yield run
    finally:
        leftovers = stop(run)
        redis.Redis.from_url(redis_url).flushdb()
    assert not leftovers, f"left running after make dev stopped: {leftovers}\n{run.output()}"
    for port in (run.web_port, run.flower_port):
        assert not listening(port), f"port {port} still listening"


def stop(run: MakeDev) -> dict[int, str]:
    """Ctrl-C: SIGINT to make's process group, then wait for make to exit. Returns what was
    still running afterwards (and kills it, all of it started by this test)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.proc.pid, signal.SIGINT)
    try:
        run.proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait(10)
    # honcho puts each Procfile process in a session of its own: find them by the marker.
    deadline = time.monotonic() + 10
    while (leftovers := marked_processes(run.token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers


def test_make_dev_runs_web_worker_beat_and_flower_and_stops_them_all(make_dev: MakeDev) -> None:
    run = make_dev
    web = f"http://127.0.0.1:{run.web_port}"
    flower = f"http://127.0.0.1:{run.flower_port}"

    # The web: the control room sends an anonymous visitor to its login page.
    assert wait_for(lambda: http_status(f"{web}/") == 302, "the web on /", run.alive)
    assert http_status(f"{web}/login/") == 200

    # The worker answers a broadcast ping on the test's own broker.
    def ping() -> list[Any]:
        with Celery(broker=run.redis_url) as probe:
            return probe.control.ping(timeout=1.0) or []

    replies = wait_for(ping, "a worker to answer a ping", run.alive)
    assert len(replies) == 1, replies

    # The beat is up and what it sends reaches the worker (tether.sweep: every 2 s; nothing
    # else sends it on this Redis db).
    def beat_task_done() -> bool:
        output = run.output()
        return (
            "beat: Starting..." in output
            and "Scheduler: Sending due task tether-sweep (tether.sweep)" in output
            and bool(re.search(r"Task tether\.sweep\[[0-9a-f-]+\] succeeded", output))
        )

    wait_for(beat_task_done, "the beat's tether.sweep to run on the worker", run.alive)

    # Flower, only with its credentials.
    assert wait_for(
        lambda: http_status(f"{flower}/") == 401, "Flower to refuse without credentials", run.alive
    )
    assert http_status(f"{flower}/", auth=run.flower_auth) == 200
    assert http_status(f"{flower}/", auth=(run.flower_auth[0], "wrong")) == 401

    # The venv's programs run, although its bin is not on the PATH make was given; Flower's
    # password reaches it through its environment, never a command line.
    running = marked_processes(run.token).values()
    venv = f"{ROOT}/.venv/bin"
    for name, program in (
        ("web", f"{venv}/daphne -b 127.0.0.1 -p {run.web_port} "),
        ("worker", f"{venv}/celery -A annihilation worker "),
        ("beat", f"{venv}/celery -A annihilation beat "),
        ("flower", f"-m celery -A annihilation flower --port={run.flower_port} "),
    ):
        assert any(c.startswith(f"{venv}/python") and program in c for c in running), (
            name,
            list(running),
        )
    assert not any(run.flower_auth[1] in c for c in running)
