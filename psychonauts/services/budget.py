"""What a model call costs, and the budgets that refuse the next one.

Apps above psychonauts take part through two hooks they register from their AppConfig.ready():
gates, asked before every provider call (after the quantum run's and the wave's budgets), and
recorders, told what every call cost once its turn is durable (psychonauts.budget_hooks holds
them, apart from this module's imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from bursts.models import AgentRun
from psychonauts.budget_hooks import (
    SPEND_GATES as SPEND_GATES,
)
from psychonauts.budget_hooks import (
    SPEND_RECORDERS as SPEND_RECORDERS,
)
from psychonauts.budget_hooks import (
    CallCheck as CallCheck,
)
from psychonauts.budget_hooks import (
    CallSpend as CallSpend,
)
from psychonauts.budget_hooks import (
    SpendGate as SpendGate,
)
from psychonauts.budget_hooks import (
    SpendRecorder as SpendRecorder,
)
from psychonauts.budget_hooks import (
    spend_gate_register as spend_gate_register,
)
from psychonauts.budget_hooks import (
    spend_recorder_register as spend_recorder_register,
)
from psychonauts.endpoints import registry_price
from psychonauts.errors import BudgetExceeded


def _price(model: str) -> tuple[float, float] | None:
    """USD per million tokens (in, out): a registry endpoint's price for the model when one
    gives it, else PSYCHONAUTS_PRICES; None when neither knows the model (its price is
    unknown: no other model's price stands in for it)."""
    registered = registry_price(model)
    if registered is not None:
        return registered
    prices: dict[str, tuple[float, float]] = settings.PSYCHONAUTS_PRICES
    return prices.get(model)


# Prompt cache tokens, priced as a share of the model's input price (Anthropic's pricing: a read
# costs a tenth, a write for five minutes a quarter more, a write for an hour twice the price).
CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25
CACHE_WRITE_LONG_FACTOR = 2.0


def cost_usd(
    model: str,
    tokens_in: int,
    tokens_out: int,
    *,
    cache_read: int = 0,
    cache_write: int = 0,
    cache_write_long: int = 0,
) -> Decimal | None:
    """What a call cost: `tokens_in` at the input price, the cache's tokens at their share of
    it, `tokens_out` at the output price; None when the model's price is unknown."""
    price = _price(model)
    if price is None:
        return None
    p_in, p_out = price
    weighted_in = (
        tokens_in
        + cache_read * CACHE_READ_FACTOR
        + cache_write * CACHE_WRITE_FACTOR
        + cache_write_long * CACHE_WRITE_LONG_FACTOR
    )
    return Decimal(str(round((weighted_in * p_in + tokens_out * p_out) / 1_000_000, 6)))


@dataclass(frozen=True)
class WaveBudget:
    wave_id: int
    limit_usd: Decimal | None


@dataclass(frozen=True)
class Spend:
    """What the budgets have spent so far: the quantum run's (or the lone agent run's), and the
    wave's when the wave has a budget."""

    run: Decimal
    wave: Decimal | None = None


def spend_recorded(spend: CallSpend) -> None:
    """Tell the recorders what a call cost (after its turn was written: a crash in between
    leaves the call unrecorded rather than counted twice when the run resumes)."""
    for recorder in SPEND_RECORDERS:
        recorder(spend)


def budget_check(
    run: AgentRun, *, spend: Spend, wave: WaveBudget | None, model: str, estimate_tokens_in: int
) -> None:
    """Refuse the next call if it would take the quantum run (or the wave) over budget, or if a
    registered gate refuses it. `run.quantum` is loaded (the gates see its labels)."""
    # A model of unknown price spends nothing the budgets can count (its calls are recorded
    # as unpriced, and shown so).
    estimate = cost_usd(model, estimate_tokens_in, 0) or Decimal(0)
    limit = Decimal(str(settings.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD))
    scope = "quantum run" if run.quantum_run_id else "agent run"
    if spend.run + estimate > limit:
        raise BudgetExceeded(
            f"budget: the {scope} has spent ${spend.run:.4f} of ${limit:.4f}; "
            f"the next call (about ${estimate:.4f}) would exceed it"
        )
    limit_wave = wave.limit_usd if wave is not None else None
    if limit_wave is not None and spend.wave is not None and spend.wave + estimate > limit_wave:
        raise BudgetExceeded(
            f"budget: wave {wave.wave_id} has spent ${spend.wave:.4f} of "  # type: ignore[union-attr]
            f"${limit_wave:.4f}; the next call would exceed it"
        )
    if SPEND_GATES:
        check = CallCheck(
            agent_run_id=run.pk,
            quantum_id=run.quantum_id,
            labels=tuple(run.quantum.labels),
            model=model,
            estimate_usd=estimate,
        )
        for gate in SPEND_GATES:
            gate(check)
