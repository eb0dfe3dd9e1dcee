"""Writes of the bursts app: waves and their bursts, the run step, stage slots, the safety net;
and the one writer module of each table (waves, bursts, quantum_runs, agent_runs)."""

from __future__ import annotations

from bursts.services.agents import SlotResult, slot_run
from bursts.services.resume import agent_resume
from bursts.services.runs import run_step
from bursts.services.safety import SafetyReport, safety_net
from bursts.services.waves import wave_advance, wave_cancel, wave_start

__all__ = [
    "SafetyReport",
    "SlotResult",
    "agent_resume",
    "run_step",
    "safety_net",
    "slot_run",
    "wave_advance",
    "wave_cancel",
    "wave_start",
]
