"""Choosing among skills by their record (pure: no database, the generator injected).

Each arm is (skill id, alpha, beta, uses): alpha - 1 successes and beta - 1 failures on a
Beta(1, 1) prior. Ties go to the lowest id, so a seeded generator gives the same choice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["thompson", "ucb1", "mean"]
POLICIES: tuple[Policy, ...] = ("thompson", "ucb1", "mean")


@dataclass(frozen=True)
class Arm:
    skill_id: int
    alpha: float
    beta: float
    uses: int


def posterior_mean(arm: Arm) -> float:
    return arm.alpha / (arm.alpha + arm.beta)


def ucb1_score(arm: Arm, total_uses: int) -> float:
    """Posterior mean plus the UCB1 exploration bonus sqrt(2 ln N / n); an unused arm is
    infinite (tried first)."""
    if arm.uses == 0:
        return math.inf
    return posterior_mean(arm) + math.sqrt(2 * math.log(max(total_uses, 1)) / arm.uses)


def choose(arms: Sequence[Arm], *, policy: Policy, rng: random.Random) -> int | None:
    """The chosen skill's id (None without arms)."""
    if not arms:
        return None
    ordered = sorted(arms, key=lambda a: a.skill_id)
    if policy == "thompson":
        scores = [rng.betavariate(a.alpha, a.beta) for a in ordered]
    elif policy == "ucb1":
        total = sum(a.uses for a in ordered)
        scores = [ucb1_score(a, total) for a in ordered]
    elif policy == "mean":
        scores = [posterior_mean(a) for a in ordered]
    else:
        raise ValueError(f"unknown skill policy {policy!r}")
    best = max(range(len(ordered)), key=lambda i: (scores[i], -i))
    return ordered[best].skill_id
