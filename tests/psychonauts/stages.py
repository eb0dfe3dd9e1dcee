"""An agent run inside a quantum run whose stage carries the verify/verdict options (the pipeline
snapshot as the burst manager freezes it), for tests that run the agent in process."""

from __future__ import annotations

from typing import Any

from bursts.models import AgentRun, Burst, QuantumRun, Wave
from quanta.models import Quantum


def staged_run(quantum: Quantum, role: str, *, provider: str = "", **options: Any) -> AgentRun:
    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    stage = {
        "index": 0,
        "name": "implement" if role == "coder" else "review",
        "mode": "sequential",
        "agents": [{"role": role, "settings": {}}],
        "condition": "",
        "retries": 0,
        "timeout_s": 0,
        **options,
    }
    quantum_run = QuantumRun.objects.create(
        wave=wave,
        burst=burst,
        quantum=quantum,
        status="running",
        pipeline_name="test",
        pipeline_snapshot={"name": "test", "stages": [stage]},
    )
    return AgentRun.objects.create(
        agent_id=f"{quantum.pk}_s0_{role}",
        quantum=quantum,
        quantum_run=quantum_run,
        role=role,
        provider=provider,
    )
