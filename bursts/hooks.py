"""Extension points that apps above bursts fill from their AppConfig.ready() (tether, reflection).

The burst manager calls them; it never imports those apps. Each hook runs inside the manager's
transaction with the wave locked: keep it to a few rows, and defer slow work (git, Celery) with
`transaction.on_commit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bursts.models import Burst, QuantumRun

# f([(run, quantum_outcome), ...]): finished runs were applied to their quanta, a drain's
# runs (up to a thousand) at once, so that a hook can act on them in set-wide statements.
# quantum_outcome is "done" (closed), "error" (back to open), "blocked" (quarantined after N
# failures), "cancelled" or "untouched" (someone changed the quantum meanwhile).
RunsDrained = Callable[[Sequence[tuple["QuantumRun", str]]], None]
ON_RUNS_DRAINED: list[RunsDrained] = []

# f(burst): the burst just closed (phase done), called inside burst_close's transaction.
BurstClosed = Callable[["Burst"], None]
ON_BURST_CLOSED: list[BurstClosed] = []

# f(): why the agents of a wave started now could not run in this configuration (a provider
# without its key, no repository), one line that says what to do; None when nothing is wrong.
# `start_wave` prints each as a warning (the workers' own environment may differ).
WaveCheck = Callable[[], str | None]
WAVE_CHECKS: list[WaveCheck] = []
