"""The operations app's errors."""

from __future__ import annotations


class OperationsError(Exception):
    """Base of every error the operations app raises."""


class MetricsUnauthorized(OperationsError):
    """A scrape of /metrics without the configured bearer token."""
