"""Reflection's settings fail loudly on a bad value when the project starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start(**overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "annihilation.settings", **overrides},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ANNIHILATION_REFLECTION_SKILL_POLICY", "greedy"),
        ("ANNIHILATION_REFLECTION_PROVEN_CONFIDENCE", "1.5"),
        ("ANNIHILATION_REFLECTION_DEMOTE_BELOW", "2"),
        ("ANNIHILATION_REFLECTION_HALF_LIFE_DAYS", "0"),
    ],
)
def test_it_refuses_a_bad_value(name: str, value: str) -> None:
    result = _start(**{name: value})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured:"), last
    assert name.removesuffix("_CONFIDENCE").removesuffix("_DEMOTE_BELOW") in last


def test_it_starts_with_a_good_policy() -> None:
    assert _start(ANNIHILATION_REFLECTION_SKILL_POLICY="ucb1").returncode == 0
