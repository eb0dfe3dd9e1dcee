"""The budgets' hooks: gates asked before every model call and recorders told what each call
cost (psychonauts.services.budget calls them). Apps above psychonauts register theirs from their
AppConfig.ready(); this module imports nothing of the runtime, so registering costs a process
(a command that calls no model) nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class CallCheck:
    """The model call about to be made, as a gate sees it: whose it is and about what it costs
    (its input, estimated from the prompt's length)."""

    agent_run_id: int
    quantum_id: int
    labels: tuple[str, ...]
    model: str
    estimate_usd: Decimal


@dataclass(frozen=True)
class CallSpend:
    """A model call made, as a recorder sees it: whose it was and what it cost."""

    agent_run_id: int
    quantum_id: int
    labels: tuple[str, ...]
    provider: str
    model: str
    tokens_in: int
    tokens_out: int
    usd: Decimal  # 0 when the model's price is unknown (priced False)
    cache_read: int = 0
    cache_write: int = 0  # five minutes and one hour together
    priced: bool = True


# A gate refuses a call by raising: SuspendRun pauses the run (it waits, holding no worker,
# until someone resumes it; the call is made then), BudgetExceeded ends it in error.
SpendGate = Callable[[CallCheck], None]
SpendRecorder = Callable[[CallSpend], None]
SPEND_GATES: list[SpendGate] = []
SPEND_RECORDERS: list[SpendRecorder] = []


def spend_gate_register(gate: SpendGate) -> None:
    if gate not in SPEND_GATES:
        SPEND_GATES.append(gate)


def spend_recorder_register(recorder: SpendRecorder) -> None:
    if recorder not in SPEND_RECORDERS:
        SPEND_RECORDERS.append(recorder)
