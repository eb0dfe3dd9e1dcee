"""What a model call costs, and the budgets that refuse the next one."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from bursts.models import AgentRun
from psychonauts.errors import BudgetExceeded


def _price(model: str) -> tuple[float, float]:
    prices: dict[str, tuple[float, float]] = settings.PSYCHONAUTS_PRICES
    return prices.get(model, settings.PSYCHONAUTS_DEFAULT_PRICE)


def cost_usd(model: str, tokens_in: int, tokens_out: int) -> Decimal:
    p_in, p_out = _price(model)
    return Decimal(str(round((tokens_in * p_in + tokens_out * p_out) / 1_000_000, 6)))


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


def budget_check(
    run: AgentRun, *, spend: Spend, wave: WaveBudget | None, model: str, estimate_tokens_in: int
) -> None:
    """Refuse the next call if it would take the quantum run (or the wave) over budget."""
    estimate = cost_usd(model, estimate_tokens_in, 0)
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
