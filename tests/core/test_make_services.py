"""`make stop` stops only this checkout's servers, and `make demo` / `make dev` on other ports
talk to the services on those ports.

Fast: Redis servers of the test's own (no Postgres), and `make -n` for the demo's commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.ConnectionError:
        return False


def redis_start(folder: Path, port: int) -> int:
    """A redis-server on `port` working in `folder`, as scripts/services.sh starts one."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--daemonize", "yes", "--pidfile", str(folder / "redis.pid"),
         "--logfile", str(folder / "redis.log"), "--save", "", "--appendonly", "no"],
        check=True, capture_output=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not answers(port):
        assert time.monotonic() < deadline, "redis did not start"
        time.sleep(0.05)
    return int(redis.Redis(port=port).info("server")["process_id"])


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids of the servers a test starts, stopped at its end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def services(action: str, home: Path, redis_port: int) -> subprocess.CompletedProcess[str]:
    (pg_port,) = free_ports(1)
    env = {**os.environ, "ANNIHILATION_HOME": str(home), "PG_PORT": str(pg_port)}
    env["REDIS_PORT"] = str(redis_port)
    return subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), action],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_stop_leaves_running_a_redis_this_checkout_did_not_start(
    tmp_path: Path, started: list[int]
) -> None:
    (port,) = free_ports(1)
    pid = redis_start(tmp_path / "elsewhere", port)
    started.append(pid)
    home = tmp_path / "home"
    # Even a pid file of ours that names it (a pid reused, a file copied) does not make it ours.
    (home / "redis").mkdir(parents=True)
    (home / "redis" / "redis.pid").write_text(f"{pid}\n")

    status = services("status", home, port)
    stop = services("stop", home, port)

    assert stop.returncode == 0, stop.stderr
    assert answers(port)
    assert "not this checkout's" in stop.stderr
    assert "another program answers" in status.stderr


def test_stop_stops_this_checkouts_own_redis(tmp_path: Path, started: list[int]) -> None:
    (port,) = free_ports(1)
    home = tmp_path / "home"
    started.append(redis_start(home / "redis", port))

    assert "redis: running" in services("status", home, port).stderr
    stop = services("stop", home, port)

    assert stop.returncode == 0, stop.stderr
    assert "redis stopped" in stop.stderr
    assert not answers(port)


def demo_commands(*args: str, **env: str) -> list[str]:
    """The commands `make demo` would run (make -n), with the caller's environment but the
    database and Redis URLs unless given."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", *args],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if "manage.py" in line]


def test_make_demo_on_other_ports_talks_to_the_services_on_those_ports() -> None:
    commands = demo_commands("DEV_PG_PORT=51234", "DEV_REDIS_PORT=52345")

    assert len(commands) == 2  # migrate, then the demo
    for line in commands:
        assert "PG_PORT=51234" in line and "REDIS_PORT=52345" in line
        assert "DATABASE_URL='postgres://postgres@127.0.0.1:51234/annihilation'" in line
        assert "REDIS_URL='redis://127.0.0.1:52345/0'" in line


def test_make_demo_keeps_urls_given_explicitly() -> None:
    given = demo_commands("DEV_PG_PORT=51234", DATABASE_URL="postgres://u@db.example:5/x")
    on_the_line = demo_commands("REDIS_URL=redis://cache.example:6/1")

    assert all("DATABASE_URL='postgres://u@db.example:5/x'" in line for line in given)
    assert all("REDIS_URL='redis://cache.example:6/1'" in line for line in on_the_line)
