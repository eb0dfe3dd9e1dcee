"""Shared fixtures. Tests run against the real Postgres and Redis that `make test` starts."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection
from pytest_django.fixtures import Settings as SettingsWrapper

from autopilot.services.budgets import spend_flush
from bursts.executor import EXECUTOR, Executor
from core.redis import get_redis
from psychonauts.routing.endpoints import registry_invalidate
from psychonauts.workspaces.worktrees import demo_repo_ensure


@pytest.fixture(scope="session", autouse=True)
def test_database_released(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """At the end of the session, before the test database is dropped: write the zero-cost model
    calls this process counted (written at exit otherwise, when the database is gone), and end
    the sessions that still hold it (a worker, server or beat process a test stopped that is
    still exiting, a thread's pooled connection), naming each on stderr, so that dropping it
    cannot fail."""
    yield
    with django_db_blocker.unblock():
        spend_flush()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, state, left(query, 120), pg_terminate_backend(pid) "
                "FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            for pid, name, state, query, _ in cursor.fetchall():
                sys.stderr.write(
                    f"ended a session left on the test database: {pid} {name!r} {state} {query!r}\n"
                )


@pytest.fixture(autouse=True)
def fresh_endpoint_registry() -> Iterator[None]:
    """Each test reads the endpoint registry of its own database: the process keeps a snapshot
    for a few seconds, which would outlive a test's rolled-back rows."""
    registry_invalidate()
    yield
    registry_invalidate()


@pytest.fixture
def executor() -> Iterator[Callable[[Executor], Executor]]:
    """Install an executor behind the bursts seam for this test: `executor(fn)`. The one
    registered when the apps loaded (the agent runtime) is back after the test. (A worker
    subprocess installs its own: tests/bursts/worker.py.)"""
    with EXECUTOR.replaced(*EXECUTOR):
        yield EXECUTOR.register


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """The project's Redis, emptied before and after the test (each test has its own db)."""
    client = get_redis()
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def repo(tmp_path: Path, settings: SettingsWrapper, redis_client: redis.Redis) -> Iterator[Path]:
    """A fresh demo repository; worktrees, locks and scripts under the test's own folder."""
    path = demo_repo_ensure(tmp_path / "repo")
    settings.ANNIHILATION_REPO = path
    settings.ANNIHILATION_HOME = tmp_path / "home"
    settings.PSYCHONAUTS_WORKTREES = tmp_path / "home" / "worktrees"
    settings.PSYCHONAUTS_WORKSPACE_MODE = "worktree"
    settings.PSYCHONAUTS_PROVIDER = ""
    settings.PSYCHONAUTS_RETRY_BASE_S = 0.01
    settings.PSYCHONAUTS_TEXT_FLUSH_S = 0.0
    yield path
