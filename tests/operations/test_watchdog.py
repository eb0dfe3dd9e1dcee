"""With no worker at all, the beat process itself fires `no_worker` (the tick task would need
a worker to run), and resolves it once a worker consumes the queue."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from core.models import Event
from operations.models import Alert, AlertStatus
from tests.bursts.conftest import ROOT, Worker, worker_env
from tests.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def beat(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = worker_env(ANNIHILATION_OPERATIONS_TICK_S="1", ANNIHILATION_PING_TIMEOUT_S="0.3")
    log = (tmp_path / "beat.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "annihilation", "beat", "-l", "warning",
         "-s", str(tmp_path / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield proc
    proc.terminate()
    proc.wait(10)
    log.close()


def test_the_beat_fires_no_worker_when_nobody_consumes_the_queue(
    beat, redis_client, make_worker: Callable[..., Worker]
) -> None:
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.lpush("celery", json.dumps({"body": "", "headers": {"task": "nothing"}}))

    wait_for(
        lambda: Alert.objects.filter(rule="no_worker", status=AlertStatus.FIRING).exists(),
        timeout=20,
    )
    alert = Alert.objects.get(rule="no_worker")
    assert "make dev" in alert.message
    assert Event.objects.filter(topic="alerts", type="alert_fired").count() == 1

    make_worker("consumer", beat=False)
    wait_for(
        lambda: Alert.objects.filter(rule="no_worker", status=AlertStatus.RESOLVED).exists(),
        timeout=20,
    )
