"""The Tether's real worker and scripts, for the tests of several repositories at once."""

from __future__ import annotations

from tests.tether.conftest import make_quantum, scripts, tether_settings, tether_worker

__all__ = ["make_quantum", "scripts", "tether_settings", "tether_worker"]
