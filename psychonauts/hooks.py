"""What the agent runtime does when the burst manager drains runs (bursts.hooks.ON_RUNS_DRAINED)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psychonauts.containment.identities import identities_release

if TYPE_CHECKING:
    from bursts.models import QuantumRun


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """The drained runs' quanta run no command any more: their sandbox uids are released (one
    statement for the whole drain)."""
    identities_release(quantum_ids=[run.quantum_id for run, _ in drained])
