"""Fixtures of the operations tests: logged-in clients, and real workers (the bursts tests')."""

from __future__ import annotations

import pytest
from django.test import Client

from core.access import viewer_ensure
from tests.bursts.conftest import fast_settings, make_worker, step_log

__all__ = ["fast_settings", "make_worker", "step_log"]  # the real workers' fixtures


@pytest.fixture
def viewer_client(client: Client, db: None) -> Client:
    client.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    return client


@pytest.fixture
def quick_ping(settings):
    """Asking the workers waits this long for answers (a test with none pays it each time)."""
    settings.OPERATIONS_PING_TIMEOUT_S = 0.3
    return settings
