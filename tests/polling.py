"""Waiting in tests for what real workers, browsers and timers do in their own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy and return its value; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
