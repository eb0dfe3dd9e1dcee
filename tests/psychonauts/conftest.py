"""Fixtures for the agent runtime: a real git repository per test, quanta, agent runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from bursts.models import AgentRun
from psychonauts.roles import roles_sync_defaults
from psychonauts.services import agent_run_create
from psychonauts.workspaces import demo_repo_ensure
from quanta.models import Quantum
from quanta.services import quantum_create


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


@pytest.fixture
def scripts(tmp_path: Path, settings: SettingsWrapper) -> Callable[[str, str], None]:
    """Write a test-only script; it is loaded along with the shipped ones."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    settings.PSYCHONAUTS_SCRIPT_DIRS = [*settings.PSYCHONAUTS_SCRIPT_DIRS, folder]

    def write(name: str, text: str) -> None:
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")

    return write


@pytest.fixture
def make_quantum(db: None) -> Callable[..., Quantum]:
    def make(title: str = "Add a greeting", **fields: Any) -> Quantum:
        return quantum_create(title=title, **fields)

    return make


@pytest.fixture
def make_run(make_quantum: Callable[..., Quantum]) -> Callable[..., AgentRun]:
    roles_sync_defaults()

    def make(role: str = "coder", *, quantum: Quantum | None = None, **fields: Any) -> AgentRun:
        quantum = quantum or make_quantum()
        return agent_run_create(quantum_id=quantum.pk, role=role, **fields)

    return make
