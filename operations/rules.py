"""The alert rules: each turns the figures of one tick into a reading (value, threshold,
message). Pure functions of their inputs; `operations.services` applies the readings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from core.workers import NO_WORKER_HINT
from operations.models import MetricSample
from operations.selectors import Figures

RULES: dict[str, str] = {
    "no_worker": "tasks wait in a queue no worker consumes",
    "queue_backlog": "tasks waiting in one queue",
    "error_rate": "errors per minute",
    "stuck_agents": "running agents without a heartbeat",
    "budget_burn": "spend in USD per hour",
    "endpoint_down": "model endpoints marked down",
    "question_waiting": "seconds the oldest Tether question has waited",
    "review_waiting": "seconds the oldest change review has been due",
    "cache_miss": "share of model input tokens not read from the prompt cache",
}

# Under this many input tokens in the window, the cache's share says nothing (a quiet system).
CACHE_MISS_MIN_TOKENS = 20_000


@dataclass(frozen=True)
class Reading:
    rule: str
    value: float
    threshold: float
    message: str

    @property
    def breached(self) -> bool:
        """At or above the threshold (a zero figure never fires, whatever the threshold)."""
        return self.value > 0 and self.value >= self.threshold


def _rate(now_total: float, base: MetricSample | None, name: str, now: datetime) -> float:
    """Growth per second of a total since the window's base sample (0 without one; a total
    that went back, a metrics directory emptied, counts from zero)."""
    if base is None:
        return 0.0
    elapsed = (now - base.at).total_seconds()
    if elapsed <= 0:
        return 0.0
    before = float(base.values.get(name, 0.0))
    grown = now_total - before if now_total >= before else now_total
    return grown / elapsed


def reading(rule: str, value: float, message: str) -> Reading:
    return Reading(rule, round(value, 4), float(settings.ALERT_RULES[rule]["threshold"]), message)


def no_worker_reading(idle: dict[str, int]) -> Reading:
    """`idle`: the queues with tasks waiting that no answering worker consumes."""
    total = float(sum(idle.values()))
    queues = ", ".join(f"{name} ({n})" for name, n in sorted(idle.items()))
    return reading(
        "no_worker",
        total,
        f"{total:.0f} task(s) wait with no worker consuming their queue: {queues}; {NO_WORKER_HINT}"
        if idle
        else "every queue with work has a worker",
    )


def cache_miss_reading(figures: Figures, *, base: MetricSample | None, now: datetime) -> Reading:
    """The share of the window's input tokens not read from a prompt cache: it rises when the
    hit ratio falls (a prompt whose prefix changes each turn, a cache that expires between
    turns). 0 when the window saw too few input tokens to say."""
    window = now - base.at if base is not None else None
    seconds = window.total_seconds() if window is not None else 0.0
    prompt = _rate(figures["prompt_tokens_total"], base, "prompt_tokens_total", now) * seconds
    read = _rate(figures["cache_read_tokens_total"], base, "cache_read_tokens_total", now) * seconds
    if prompt < CACHE_MISS_MIN_TOKENS:
        return reading("cache_miss", 0.0, f"{prompt:.0f} input tokens: too few to judge the cache")
    miss = 1 - read / prompt
    return reading(
        "cache_miss",
        miss,
        f"{1 - miss:.0%} of {prompt:.0f} input tokens read from the prompt cache",
    )


def readings(
    figures: Figures, *, idle: dict[str, int], base: MetricSample | None, now: datetime
) -> list[Reading]:
    errors_per_min = _rate(figures["errors_total"], base, "errors_total", now) * 60
    usd_per_hour = _rate(figures["cost_usd_total"], base, "cost_usd_total", now) * 3600
    return [
        cache_miss_reading(figures, base=base, now=now),
        no_worker_reading(idle),
        reading(
            "queue_backlog",
            figures["queue_depth_max"],
            f"{figures['queue_depth_max']:.0f} task(s) wait in the fullest queue",
        ),
        reading("error_rate", errors_per_min, f"{errors_per_min:.2f} errors a minute"),
        reading(
            "stuck_agents",
            figures["agents_stuck"],
            f"{figures['agents_stuck']:.0f} running agent(s) without a heartbeat for "
            f"{settings.ALERT_STUCK_AFTER_S:.0f} s",
        ),
        reading("budget_burn", usd_per_hour, f"spending ${usd_per_hour:.2f} an hour"),
        reading(
            "endpoint_down",
            figures["endpoints_down"],
            f"{figures['endpoints_down']:.0f} model endpoint(s) marked down",
        ),
        reading(
            "question_waiting",
            figures["question_oldest_s"],
            f"the oldest of {figures['questions_pending']:.0f} Tether question(s) has waited "
            f"{figures['question_oldest_s']:.0f} s",
        ),
        reading(
            "review_waiting",
            figures["review_oldest_s"],
            f"the oldest of {figures['reviews_due']:.0f} change review(s) due has waited "
            f"{figures['review_oldest_s']:.0f} s for its review task",
        ),
    ]
