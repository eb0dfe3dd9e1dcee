"""Extension points that apps above quanta fill from their own hooks.py (core.hooks): the
tether. quanta never imports those apps; it calls what they registered here. (Two more live
beside what they serve: `quanta.fields.VERIFY_COMMAND_CHECK` and
`quanta.pipelines.services.ROLE_NAMES`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.hooks import Hook

# f(quantum_ids, to_status): these quanta just changed status, inside the writer's transaction
# (a few rows; the burst manager's drain passes up to a thousand at once). A hook that keeps
# something tied to a quantum's state (a question about a blocked quantum) withdraws it here.
StatusChanged = Callable[[Sequence[int], str], object]
ON_STATUS_CHANGED: Hook[StatusChanged] = Hook("quanta.status_changed")


def status_changed(quantum_ids: Sequence[int], to: str) -> None:
    """Tell every registered hook that `quantum_ids` are now `to`."""
    if not quantum_ids:
        return
    for hook in ON_STATUS_CHANGED:
        hook(quantum_ids, to)
