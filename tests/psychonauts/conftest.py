"""Fixtures for the agent runtime: a real git repository per test, quanta, agent runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from bursts.models import AgentRun
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.runs import agent_run_create
from quanta.models import Quantum
from quanta.services import quantum_create


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
