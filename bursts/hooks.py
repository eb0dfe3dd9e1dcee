"""Extension points that apps above bursts fill from their own hooks.py (core.hooks): psychonauts,
tether, reflection. (Two more live beside what they serve: `bursts.executor.EXECUTOR`, the agent
runtime, and `bursts.sections.WAVE_SECTIONS`.)

The burst manager calls them; it never imports those apps. Each hook runs inside the manager's
transaction with the wave locked: keep it to a few rows, and defer slow work (git, Celery) with
`transaction.on_commit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from core.hooks import Hook

if TYPE_CHECKING:
    from bursts.models import Burst, QuantumRun

# f([(run, quantum_outcome), ...]): finished runs were applied to their quanta, a drain's
# runs (up to a thousand) at once, so that a hook can act on them in set-wide statements.
# quantum_outcome is "done" (closed), "error" (back to open), "blocked" (quarantined after N
# failures), "cancelled" or "untouched" (someone changed the quantum meanwhile).
RunsDrained = Callable[[Sequence[tuple["QuantumRun", str]]], None]
ON_RUNS_DRAINED: Hook[RunsDrained] = Hook("bursts.runs_drained")

# f(burst): the burst just closed (phase done), called inside burst_close's transaction.
BurstClosed = Callable[["Burst"], None]
ON_BURST_CLOSED: Hook[BurstClosed] = Hook("bursts.burst_closed")

# f(): why the agents of a wave started now could not run in this configuration (a provider
# without its key, no repository), one line that says what to do; None when nothing is wrong.
# `start_wave` prints each as a warning (the workers' own environment may differ).
WaveCheck = Callable[[], str | None]
WAVE_CHECKS: Hook[WaveCheck] = Hook("bursts.wave_checks")
