"""The Celery broker transport: kombu's Redis transport, with one client per channel.

kombu's Redis channel builds a new `redis.Redis` client for every operation that is not given
one (each publish, each acknowledgement, each unacked-index update): redis-py's constructor
copies its response callbacks into a case-insensitive dict, several times per task. The client wraps the channel's connection pool and holds no connection of its
own (each command borrows one from the pool), so one client per channel and pool is safe to
share between a worker's threads; a channel whose pool was replaced (a reconnect) builds a new
one.

Selected by `CELERY_BROKER_TRANSPORT = "core.broker:Transport"` with a `redis://` broker URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()  # type: ignore[attr-defined]
        yield shared


class Transport(kombu_redis.Transport):
    Channel = Channel
