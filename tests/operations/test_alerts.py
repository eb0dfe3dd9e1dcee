"""The alerter: rules fire and resolve with their cooldown, transitions recorded and published
on the `alerts` topic, and the tick reading real figures (a question waiting too long, tasks
queued with no worker)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from bursts.models import Burst, QuantumRun, Wave
from core.models import Event
from operations.models import Alert, AlertStatus, AlertTransition, MetricSample
from operations.rules import Reading
from operations.services import alerts_apply, operations_tick
from tests.factories import make_quantum
from tether.models import Reaching, ReviewDue
from tether.services import reviews_due

pytestmark = pytest.mark.django_db


def reading(value: float, *, rule: str = "queue_backlog", threshold: float = 10) -> Reading:
    return Reading(rule, value, threshold, f"{value:.0f} waiting")


@pytest.fixture
def cooldown(settings):
    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "queue_backlog": {"threshold": 10.0, "cooldown_s": 600.0},
    }


def events(kind: str) -> list[dict[str, object]]:
    return list(Event.objects.filter(topic="alerts", type=kind).values_list("payload", flat=True))


def test_it_fires_resolves_and_fires_again_only_after_the_cooldown(cooldown):
    t0 = timezone.now()
    assert [a.rule for a in alerts_apply([reading(5)], now=t0)] == []
    assert not Alert.objects.exists()

    fired = alerts_apply([reading(12)], now=t0)
    assert [(a.rule, a.status) for a in fired] == [("queue_backlog", AlertStatus.FIRING)]
    # Still breached: no second firing, no second event.
    assert alerts_apply([reading(15)], now=t0 + timedelta(seconds=30)) == []

    resolved = alerts_apply([reading(3)], now=t0 + timedelta(seconds=60))
    assert [a.status for a in resolved] == [AlertStatus.RESOLVED]
    # Breached again within the cooldown of the firing: it stays resolved.
    assert alerts_apply([reading(20)], now=t0 + timedelta(seconds=300)) == []
    assert Alert.objects.get().status == AlertStatus.RESOLVED

    again = alerts_apply([reading(20)], now=t0 + timedelta(seconds=601))
    assert [a.status for a in again] == [AlertStatus.FIRING]
    alert = Alert.objects.get()
    assert alert.fire_count == 2 and alert.value == 20

    assert list(AlertTransition.objects.order_by("id").values_list("status", flat=True)) == [
        "firing",
        "resolved",
        "firing",
    ]
    firing = events("alert_fired")
    assert len(firing) == 2 and len(events("alert_resolved")) == 1
    assert firing[0]["rule"] == "queue_backlog" and firing[0]["message"] == "12 waiting"


def test_a_zero_figure_never_fires_even_at_a_zero_threshold():
    assert alerts_apply([reading(0, threshold=0)], now=timezone.now()) == []


def test_the_tick_fires_on_a_question_that_waited_too_long(settings, quick_ping):
    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "question_waiting": {"threshold": 60.0, "cooldown_s": 0.0},
    }
    quantum = make_quantum("Needs an answer")
    reaching = Reaching.objects.create(
        quantum=quantum,
        question="which branch?",
        assumption="main",
        deadline=timezone.now() + timedelta(hours=1),
    )
    Reaching.objects.filter(pk=reaching.pk).update(created_at=timezone.now() - timedelta(minutes=5))

    changed = operations_tick()

    assert [(a.rule, a.status) for a in changed] == [("question_waiting", AlertStatus.FIRING)]
    assert "the oldest of 1 Tether question(s) has waited 3" in changed[0].message
    assert MetricSample.objects.get().values["questions_pending"] == 1

    Reaching.objects.filter(pk=reaching.pk).update(status="answered")
    assert [(a.rule, a.status) for a in operations_tick()] == [
        ("question_waiting", AlertStatus.RESOLVED)
    ]


def test_the_tick_fires_on_a_change_review_due_too_long(settings, quick_ping):
    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "review_waiting": {"threshold": 60.0, "cooldown_s": 0.0},
    }
    wave = Wave.objects.create(status="running")
    burst = Burst.objects.create(wave=wave, number=1, phase="running")
    quantum = make_quantum("Reviewed late")
    run = QuantumRun.objects.create(wave=wave, burst=burst, quantum=quantum, status="done")
    reviews_due(runs=[(run.pk, quantum.pk)])
    assert operations_tick() == []  # just due
    ReviewDue.objects.update(due_at=timezone.now() - timedelta(minutes=5))

    changed = operations_tick()

    assert [(a.rule, a.status) for a in changed] == [("review_waiting", AlertStatus.FIRING)]
    assert "the oldest of 1 change review(s) due has waited 3" in changed[0].message
    assert MetricSample.objects.latest("at").values["reviews_due"] == 1

    ReviewDue.objects.all().delete()  # the review made
    assert [(a.rule, a.status) for a in operations_tick()] == [
        ("review_waiting", AlertStatus.RESOLVED)
    ]


def test_the_tick_fires_when_tasks_wait_and_no_worker_consumes_them(quick_ping, redis_client):
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("celery")
    broker.lpush("celery", json.dumps({"body": "", "headers": {"task": "nothing"}}))
    try:
        changed = operations_tick()
    finally:
        broker.delete("celery")
    rules = {a.rule: a for a in changed}
    assert "no_worker" in rules
    assert "celery (1)" in rules["no_worker"].message
    assert "make dev" in rules["no_worker"].message
    assert events("alert_fired")[0]["rule"] == "no_worker"


def test_the_tick_keeps_an_hour_of_samples(quick_ping):
    old = MetricSample.objects.create(
        at=timezone.now() - timedelta(seconds=settings.OPERATIONS_SAMPLES_KEEP_S + 5), values={}
    )
    operations_tick()
    assert not MetricSample.objects.filter(pk=old.pk).exists()
    assert MetricSample.objects.count() == 1


def test_a_registry_endpoint_marked_down_fires_endpoint_down(
    quick_ping, redis_client, settings, client
) -> None:
    from psychonauts.routing.endpoints import endpoint_add, endpoint_mark_down, registry_invalidate

    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "endpoint_down": {"threshold": 1.0, "cooldown_s": 0.0},
    }
    endpoint_add(name="local-llama", model="llama3.1:8b", base_url="http://127.0.0.1:9/v1")
    registry_invalidate()
    endpoint_mark_down(provider="openai", model="local-llama", reason="refused", ttl_s=60)

    changed = operations_tick()

    assert [(a.rule, a.status) for a in changed] == [("endpoint_down", AlertStatus.FIRING)]
    scraped = client.get("/metrics").content.decode()
    assert (
        'annihilation_endpoint_up{endpoint="local-llama",model="llama3.1:8b",provider="openai"} 0.0'
        in scraped
    )


def test_the_tick_measures_error_rate_and_spend_over_the_window(quick_ping, settings) -> None:
    from core import metrics

    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "error_rate": {"threshold": 5.0, "cooldown_s": 0.0},
        "budget_burn": {"threshold": 10.0, "cooldown_s": 0.0},
    }
    now = timezone.now()
    metrics.error("agent")
    metrics.usage_recorded(
        provider="anthropic", model="claude-opus-4-6", tokens_in=1, tokens_out=1, cost_usd=1.0
    )
    totals = metrics.counter_totals()
    # Two minutes ago: 20 errors and $0.50 fewer: 10 errors a minute, $15 an hour.
    MetricSample.objects.create(
        at=now - timedelta(minutes=2),
        values={
            "errors_total": totals["annihilation_errors_total"] - 20,
            "cost_usd_total": totals["annihilation_cost_usd_total"] - 0.5,
        },
    )

    changed = {a.rule: a for a in operations_tick(now=now)}

    assert changed["error_rate"].status == AlertStatus.FIRING
    assert changed["error_rate"].value == pytest.approx(10, rel=0.01)
    assert changed["budget_burn"].message == "spending $15.00 an hour"


def test_the_tick_fires_when_the_prompt_cache_hit_ratio_falls(quick_ping, settings) -> None:
    from core import metrics

    settings.ALERT_RULES = {
        **settings.ALERT_RULES,
        "cache_miss": {"threshold": 0.5, "cooldown_s": 0.0},
    }
    now = timezone.now()
    # In the window: 100,000 input tokens, 30,000 of them read from the cache (a 30% hit ratio).
    metrics.usage_recorded(
        provider="anthropic", model="claude-sonnet-4-6", tokens_in=60_000, tokens_out=10,
        cost_usd=0.2, cache_read=30_000, cache_write=10_000,
    )  # fmt: skip
    totals = metrics.counter_totals()
    MetricSample.objects.create(
        at=now - timedelta(minutes=2),
        values={
            "prompt_tokens_total": totals["annihilation_prompt_tokens_total"] - 100_000,
            "cache_read_tokens_total": totals["annihilation_cache_read_tokens_total"] - 30_000,
        },
    )

    changed = {a.rule: a for a in operations_tick(now=now)}

    assert changed["cache_miss"].status == AlertStatus.FIRING
    assert changed["cache_miss"].value == pytest.approx(0.7, abs=0.01)
    assert changed["cache_miss"].message == "30% of 100000 input tokens read from the prompt cache"
