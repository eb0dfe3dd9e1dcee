"""The real-model tests run a wave on real Celery workers: the burst tests' worker fixtures."""

from tests.bursts.conftest import fast_settings, make_worker, step_log

__all__ = ["fast_settings", "make_worker", "step_log"]
