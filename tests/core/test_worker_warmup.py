"""A threads worker makes, before it takes its first task, what its first tasks would otherwise
each wait for (core/celery.py): its threads, its pooled database and Redis connections, and what
the apps register (psychonauts: the sandbox probe and the model clients)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.db import connection, connections
from psycopg_pool import ConnectionPool

import core.celery
from core.celery import (
    database_pools_fill,
    pool_threads_start,
    redis_pool_fill,
    worker_warm_up,
)
from core.warmups import WARMUPS
from tests.bursts.conftest import ROOT, worker_env


def _clients_on(client: redis.Redis) -> int:
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return sum(1 for c in client.client_list() if int(c["db"]) == db)


def test_it_starts_every_thread_of_the_pool_before_any_task() -> None:
    with ThreadPoolExecutor(max_workers=6) as executor:
        before = threading.active_count()
        assert pool_threads_start(executor, 6) == 6
        assert threading.active_count() == before + 6

        # Six tasks at once find six idle threads: none is started for them.
        release = threading.Event()
        jobs = [executor.submit(release.wait) for _ in range(6)]
        assert threading.active_count() == before + 6
        release.set()
        wait(jobs)


@pytest.mark.django_db(transaction=True)
def test_it_opens_the_database_pool_up_to_the_concurrency() -> None:
    pool: ConnectionPool | None = getattr(connections["default"], "pool", None)
    if pool is None:
        pytest.skip("ANNIHILATION_DB_POOL_MAX=0: no pool to fill")
    connection.close()  # this thread's, back to the pool: all are idle, as in a fresh worker

    opened = database_pools_fill(5)
    assert opened >= min(5, pool.max_size)
    assert pool.get_stats()["pool_size"] == opened

    # Five threads wanting a connection at once are served by those: the pool does not grow.
    barrier = threading.Barrier(5)

    def query() -> None:
        with connections["default"].cursor() as cursor:
            barrier.wait(10)
            cursor.execute("SELECT 1")
        connections["default"].close()  # back to the pool

    threads = [threading.Thread(target=query) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pool.get_stats()["pool_size"] == opened
    assert database_pools_fill(10_000) == pool.max_size


def test_it_opens_redis_connections_ahead(redis_client: redis.Redis) -> None:
    assert redis_pool_fill(6) == 6
    opened = _clients_on(redis_client)
    assert opened >= 6

    # They wait idle in the pool: taking six again opens none.
    assert redis_pool_fill(6) == 6
    assert _clients_on(redis_client) == opened


def test_a_failing_warmup_is_logged_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(core.celery, "database_pools_fill", lambda concurrency: 0)
    monkeypatch.setattr(core.celery, "redis_pool_fill", lambda concurrency: 0)
    ran: list[int] = []

    def broken(concurrency: int) -> None:
        raise RuntimeError("no sandbox today")

    with WARMUPS.replaced(broken, ran.append):
        WARMUPS.register(ran.append)  # registered once
        with caplog.at_level(logging.INFO, logger="core.celery"):
            worker_warm_up(7)

    assert ran == [7]
    failed = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in failed] == [
        "worker warm-up test_a_failing_warmup_is_logged_and_the_others_still_run.<locals>."
        "broken failed"
    ]


@pytest.fixture
def threads_worker(tmp_path: Path) -> Iterator[tuple[str, Path, Celery]]:
    """A threads worker of 6 on a queue of its own, logging at INFO; yields its node name, its
    log and a Celery client for its broker."""
    name = f"warmup-{os.getpid()}@{os.uname().nodename}"
    log = tmp_path / "worker.log"
    env = worker_env(ANNIHILATION_HOME=str(tmp_path / "home"), ANTHROPIC_API_KEY="test")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "annihilation", "worker", "-P", "threads",
             "-c", "6", "-Q", f"warmup-{os.getpid()}", "-n", name, "--without-gossip",
             "--without-mingle", "-l", "info"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    client = Celery(broker=env["REDIS_URL"])
    try:
        deadline = time.monotonic() + 30
        while not client.control.ping(destination=[name], timeout=0.3):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
        yield name, log, client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_fresh_threads_worker_is_warm_before_its_first_task(
    threads_worker: tuple[str, Path, Celery],
) -> None:
    name, log, client = threads_worker

    replies: Any = client.control.inspect(destination=[name], timeout=2).stats() or {}
    stats = replies[name]
    assert stats["pool"]["threads"] == 6
    assert stats["total"] == {}  # no task yet
    text = log.read_text()
    for warmup in ("database_pools_fill", "redis_pool_fill", "agents_warm_up"):
        assert f"worker warm-up {warmup} took" in text, text
    assert "failed" not in text, text
    if getattr(connections["default"], "pool", None) is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (others,) = cursor.fetchone() or (0,)
        assert others >= 6  # the worker's pool, filled to its concurrency


@pytest.mark.django_db(transaction=True)
def test_the_warm_up_loads_the_agent_cli_executors_the_roles_run(tmp_path: Path) -> None:
    """A role that runs Claude Code: its executor (and the MCP SDK under it) is loaded before
    the worker's first task, not by its first agent run; Codex, which no role runs, is not."""
    from psychonauts.models import Role
    from psychonauts.roles import roles_sync_defaults

    roles_sync_defaults()
    Role.objects.filter(name="coder").update(executor="claude-code")
    script = (
        "import sys, django; django.setup()\n"
        "from psychonauts.runtime.warmup import agents_warm_up\n"
        "names = ('psychonauts.executors.claude_code', 'psychonauts.executors.codex')\n"
        "print([n in sys.modules for n in names])\n"
        "agents_warm_up(1)\n"
        "print([n in sys.modules for n in names])\n"
    )
    env = worker_env(ANNIHILATION_HOME=str(tmp_path / "home"), ANTHROPIC_API_KEY="test")
    env["DJANGO_SETTINGS_MODULE"] = "annihilation.settings"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[False, False]", "[True, False]"], done.stdout
