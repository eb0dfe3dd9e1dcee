"""Writes of the bursts app: the burst manager, stage slots and the safety net."""

from __future__ import annotations

from bursts.services.agents import SlotResult, slot_run
from bursts.services.manager import run_step, wave_advance, wave_cancel, wave_start
from bursts.services.resume import agent_resume
from bursts.services.safety import SafetyReport, safety_net

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
