"""The dashboard's alerts card (firing alerts, work waiting with no worker) and the Metrics
page (charts of the last hour, rules, history)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from core.workers import worker_seen, workers_consuming_seen
from operations.rules import Reading
from operations.services import alerts_apply, operations_tick

pytestmark = pytest.mark.django_db


def test_the_dashboard_card_shows_the_firing_alerts(viewer_client: Client, redis_client) -> None:
    alerts_apply([Reading("stuck_agents", 2, 1, "2 running agent(s) stuck")], now=timezone.now())
    page = viewer_client.get("/").content.decode()
    assert 'id="operations-card"' in page
    assert 'data-rule="stuck_agents"' in page and "2 running agent(s) stuck" in page
    assert 'id="no-worker-warning"' not in page


def test_the_dashboard_card_warns_when_work_waits_with_no_worker(
    viewer_client: Client, redis_client, quick_ping
) -> None:
    assert "No alert firing." in viewer_client.get("/").content.decode()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.lpush("celery", json.dumps({"body": "", "headers": {"task": "nothing"}}))
    page = viewer_client.get("/").content.decode()
    assert 'id="no-worker-warning"' in page
    assert "1 task(s) queued" in page and "make dev" in page


def test_the_dashboard_reads_what_the_workers_consume_from_their_heartbeat_notes(
    viewer_client: Client, redis_client, settings
) -> None:
    """No worker runs here, so a broadcast would find nobody: the page trusts the notes, and
    names the queue no noted worker consumes."""
    settings.OPERATIONS_PING_TIMEOUT_S = 0.3
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.lpush("celery", json.dumps({"body": "", "headers": {"task": "nothing"}}))

    worker_seen(node="w1@h1", host="h1", now=time.time(), queues=["celery"])
    assert 'id="no-worker-warning"' not in viewer_client.get("/").content.decode()

    worker_seen(node="w1@h1", host="h1", now=time.time(), queues=["reviews"])
    page = viewer_client.get("/").content.decode()
    assert 'id="no-worker-warning"' in page and "1 task(s) queued" in page

    # A note that does not name its queues, or none at all: the workers are asked.
    worker_seen(node="w1@h1", host="h1", now=time.time(), queues=None)
    assert workers_consuming_seen() == {}
    worker_seen(node="w1@h1", host="h1", now=time.time() - 60, queues=["celery"])
    assert workers_consuming_seen() == {}


def test_the_metrics_page_charts_the_last_hour(viewer_client: Client, quick_ping) -> None:
    now = timezone.now()
    operations_tick(now=now - timedelta(minutes=10))
    operations_tick(now=now)
    alerts_apply([Reading("endpoint_down", 1, 1, "1 model endpoint(s) marked down")], now=now)
    page = viewer_client.get("/operations/metrics/").content.decode()
    assert page.count("<polyline") == 6
    assert 'id="chart-queue_depth"' in page
    assert 'data-rule="no_worker"' in page and 'data-rule="endpoint_down"' in page
    assert "1 model endpoint(s) marked down" in page
