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


# A fresh process: loads the project's apps, then each app's task module, as a command that
# sends a task does. Prints what it saw for the test below to check.
_TASK_BINDING_PROBE = r"""
import importlib, json, sys, uuid
import django
django.setup()
from django.apps import apps
from django.conf import settings
from celery.app.task import Task
from celery.app.utils import find_app
bound = {}
for config in apps.get_app_configs():
    if config.name not in settings.PROJECT_APPS:
        continue
    try:
        module = importlib.import_module(f"{config.name}.tasks")
    except ModuleNotFoundError as error:
        if error.name != f"{config.name}.tasks":
            raise
        continue
    for value in list(vars(module).values()):
        if isinstance(value, Task):
            bound[value.name] = value.app.main
queue = f"test-binding-{uuid.uuid4().hex}"
from api.tasks import purge_idempotency_keys
purge_idempotency_keys.apply_async(queue=queue)
import redis
client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
sent = client.llen(queue)
client.delete(queue)
print(json.dumps({"bound": bound, "sent": sent,
                  "found": find_app("annihilation").main}))
"""


def test_every_task_module_is_bound_to_the_app_and_celery_finds_it() -> None:
    """The `annihilation` package loads its Celery application on first use: every app's task
    module is bound to it all the same (a task a command sends goes to the project's broker),
    and `celery -A annihilation` finds it."""
    import json
    import subprocess
    import sys

    from tests.bursts.conftest import ROOT, worker_env

    proc = subprocess.run(
        [sys.executable, "-c", _TASK_BINDING_PROBE],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert len(seen["bound"]) >= 10, seen["bound"]  # the probe found the apps' tasks
    assert set(seen["bound"].values()) == {app.main}, seen["bound"]
    assert seen["sent"] == 1
    assert seen["found"] == app.main == "annihilation"
