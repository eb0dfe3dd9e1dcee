"""The broker transport (core.broker): one Redis client per channel, messages still flow."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings

from core.broker import Channel
from core.celery import app


def test_the_app_uses_it_and_a_message_goes_through() -> None:
    assert settings.CELERY_BROKER_TRANSPORT == "core.broker:Transport"
    queue = f"test-broker-{uuid.uuid4().hex}"
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        with conn.SimpleQueue(queue) as q:
            q.put({"n": 1})
            q.put({"n": 2})
            got = [q.get(timeout=5), q.get(timeout=5)]
            for message in got:
                message.ack()
            assert [m.payload for m in got] == [{"n": 1}, {"n": 2}]
            # Acknowledged: nothing is left to come back after the visibility timeout.
            with channel.conn_or_acquire() as client:
                assert client.hlen(channel.unacked_key) == 0
                q.clear()


def test_one_client_per_channel_and_pool() -> None:
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
        given = object()
        with channel.conn_or_acquire(given) as client:
            assert client is given
        channel._pool = None  # type: ignore[attr-defined]  # as a reconnect does: a new pool
        with channel.conn_or_acquire() as third:
            assert third is not first
            assert third.connection_pool is channel.pool
            assert third.ping()


def test_a_task_sent_by_name_subscribes_to_no_result_unless_asked() -> None:
    """Outside a worker, Celery's Redis backend subscribes the sender to a task's result
    channel at send time; a send by name asks for no result, so the process keeps none."""
    queue = f"test-send-{uuid.uuid4().hex}"
    backend: Any = app.backend  # Celery's Redis backend (the stubs type the base class)
    consumer = backend.result_consumer
    try:
        fired = app.send_task("bursts.safety_net", queue=queue)
        assert fired.ignored
        assert backend.get_key_for_task(fired.id) not in consumer.subscribed_to
        awaited = app.send_task("bursts.safety_net", queue=queue, ignore_result=False)
        assert backend.get_key_for_task(awaited.id) in consumer.subscribed_to
        consumer.cancel_for(awaited.id)
    finally:
        with app.connection_for_write() as conn, conn.SimpleQueue(queue) as q:
            q.clear()
