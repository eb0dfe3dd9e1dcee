"""Choosing a skill by its record: Thompson sampling, UCB1 and the posterior mean, with a
seeded generator."""

from __future__ import annotations

import math
import random
from collections import Counter

from reflection.selection import Arm, choose, posterior_mean, ucb1_score

GOOD = Arm(skill_id=1, alpha=30.0, beta=5.0, uses=33)
BAD = Arm(skill_id=2, alpha=5.0, beta=30.0, uses=33)


def test_it_chooses_nothing_without_skills() -> None:
    assert choose([], policy="thompson", rng=random.Random(0)) is None


def test_it_chooses_the_same_skill_with_the_same_seed() -> None:
    arms = [Arm(1, 2.0, 2.0, 2), Arm(2, 3.0, 2.0, 3), Arm(3, 2.0, 3.0, 3)]
    first = [choose(arms, policy="thompson", rng=random.Random(7)) for _ in range(5)]
    draws_a = random.Random(42)
    draws_b = random.Random(42)
    seq_a = [choose(arms, policy="thompson", rng=draws_a) for _ in range(50)]
    seq_b = [choose(arms, policy="thompson", rng=draws_b) for _ in range(50)]
    assert len(set(first)) == 1
    assert seq_a == seq_b
    assert len(set(seq_a)) > 1  # it explores


def test_it_converges_to_the_better_skill_by_thompson_sampling() -> None:
    """Simulated: skill 1 succeeds 80% of the time, skill 2 20%; after many draws skill 1 is
    chosen nearly always."""
    rng = random.Random(1)
    arms = {1: [1.0, 1.0, 0], 2: [1.0, 1.0, 0]}
    truth = {1: 0.8, 2: 0.2}
    late: Counter[int] = Counter()
    for draw in range(2000):
        chosen = choose(
            [Arm(i, a, b, int(n)) for i, (a, b, n) in arms.items()], policy="thompson", rng=rng
        )
        assert chosen is not None
        record = arms[chosen]
        record[0 if rng.random() < truth[chosen] else 1] += 1
        record[2] += 1
        if draw >= 1500:
            late[chosen] += 1
    assert late[1] / 500 > 0.95


def test_thompson_prefers_the_better_record() -> None:
    rng = random.Random(3)
    picks = Counter(choose([GOOD, BAD], policy="thompson", rng=rng) for _ in range(200))
    assert picks[1] > 190


def test_it_tries_an_unused_skill_first_by_ucb1() -> None:
    fresh = Arm(skill_id=9, alpha=1.0, beta=1.0, uses=0)
    assert choose([GOOD, fresh], policy="ucb1", rng=random.Random(0)) == 9


def test_ucb1_adds_the_exploration_bonus() -> None:
    arm = Arm(skill_id=1, alpha=3.0, beta=1.0, uses=4)
    assert ucb1_score(arm, 16) == 0.75 + math.sqrt(2 * math.log(16) / 4)


def test_ucb1_explores_a_little_used_skill_with_a_worse_mean() -> None:
    worn = Arm(skill_id=1, alpha=61.0, beta=41.0, uses=100)  # mean ~0.598
    rare = Arm(skill_id=2, alpha=1.0, beta=2.0, uses=1)  # mean 0.333, big bonus
    assert choose([worn, rare], policy="ucb1", rng=random.Random(0)) == 2
    assert choose([worn, rare], policy="mean", rng=random.Random(0)) == 1


def test_the_mean_policy_takes_the_best_posterior_mean_lowest_id_on_ties() -> None:
    assert posterior_mean(GOOD) == 30 / 35
    tie = [Arm(5, 2.0, 2.0, 2), Arm(4, 2.0, 2.0, 2)]
    assert choose(tie, policy="mean", rng=random.Random(0)) == 4
    assert choose([BAD, GOOD], policy="mean", rng=random.Random(0)) == 1
