"""The metrics every process counts (Prometheus); served at /metrics by the operations app."""

from __future__ import annotations

from prometheus_client import Counter

VALIDATION_FAILURES = Counter(
    "annihilation_validation_failures_total",
    "Input refused at an entry point (CLI, web form, API, webhook, model output), by entry.",
    ["entry"],
)


def validation_failed(entry: str) -> None:
    """Count one refused input at `entry` (e.g. "api", "webhook", "cli", "form")."""
    VALIDATION_FAILURES.labels(entry=entry).inc()
