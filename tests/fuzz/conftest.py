"""Shared settings of the property-based tests: 100 examples each (the package runs in seconds;
FUZZ_EXAMPLES=5000 searches longer), no deadline (the database and Redis are real), and no
example database written into the tree."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
