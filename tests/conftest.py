"""Shared fixtures. Tests run against the real Postgres and Redis that `make test` starts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from annihilation.redis import get_redis


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """The project's Redis, emptied before and after the test (each test has its own db)."""
    client = get_redis()
    client.flushdb()
    yield client
    client.flushdb()
