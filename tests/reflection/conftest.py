"""Rows the reflection tests share: a wave with one burst, and an agent run."""

from __future__ import annotations

from typing import Any

import pytest

from bursts.models import AgentRun, Burst, Wave
from psychonauts.runtime.runs import agent_run_create
from quanta.services import quantum_create


@pytest.fixture
def burst(db: Any) -> Burst:
    wave = Wave.objects.create()
    return Burst.objects.create(wave=wave, number=1)


@pytest.fixture
def agent_run(db: Any) -> AgentRun:
    return agent_run_create(quantum_id=quantum_create(title="q").pk, role="coder")
