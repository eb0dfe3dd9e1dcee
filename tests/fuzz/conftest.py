"""Shared settings of the property-based tests: 100 examples each (the package runs in seconds;
FUZZ_EXAMPLES=5000 searches longer), no deadline (the database and Redis are real), and no
example database written into the tree."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.workspaces import demo_repo_ensure

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def repo(tmp_path: Path, settings: SettingsWrapper, redis_client: redis.Redis) -> Iterator[Path]:
    """A fresh demo repository, as the agent runtime's tests make it."""
    path = demo_repo_ensure(tmp_path / "repo")
    settings.ANNIHILATION_REPO = path
    settings.ANNIHILATION_HOME = tmp_path / "home"
    settings.PSYCHONAUTS_WORKTREES = tmp_path / "home" / "worktrees"
    settings.PSYCHONAUTS_WORKSPACE_MODE = "worktree"
    settings.PSYCHONAUTS_PROVIDER = ""
    yield path
