"""Reads: the figures of the system now (for /metrics, the samples and the alert rules), the
alerts, and the last hour of samples as chart series.

Every figure is a cheap query: live agents and pending questions through their partial
indexes, queue depths and endpoint health from Redis, totals from the metric files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from bursts.models import AGENT_LIVE, AgentRun, AgentStatus
from bursts.selectors import celery_queue_depths
from core import metrics
from core.workers import workers_consuming, workers_consuming_seen
from operations.models import Alert, AlertStatus, AlertTransition, MetricSample
from psychonauts.routing.endpoints import (
    endpoints_down,
    endpoints_failing,
    endpoints_state,
    registry_enabled,
)
from tether.models import Reaching, ReachingStatus, ReviewDue


class Figures(TypedDict):
    """What one look at the system finds (all numbers, so that a sample stores them as is)."""

    queue_depth: float  # tasks waiting in every queue
    queue_depth_max: float  # in the fullest queue
    agents_pending: float
    agents_running: float
    agents_waiting: float
    agents_stuck: float
    questions_pending: float
    question_oldest_s: float
    reviews_due: float
    review_oldest_s: float
    endpoints_down: float
    errors_total: float
    cost_usd_total: float
    tokens_total: float
    prompt_tokens_total: float  # model input tokens, cached or not
    cache_read_tokens_total: float  # of those, read from a prompt cache


def queue_depths() -> dict[str, int]:
    """Tasks waiting per Celery queue (0 for a queue Redis could not be asked about)."""
    return {name: n or 0 for name, n in celery_queue_depths().items()}


def agents_by_status() -> dict[str, int]:
    counts = dict(
        AgentRun.objects.filter(status__in=AGENT_LIVE)
        .values("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return {status: int(counts.get(status, 0)) for status in AGENT_LIVE}


def agents_stuck(*, now: datetime) -> int:
    """Running agents whose worker has not renewed their heartbeat for ALERT_STUCK_AFTER_S."""
    since = now - timedelta(seconds=settings.ALERT_STUCK_AFTER_S)
    return AgentRun.objects.filter(status=AgentStatus.RUNNING, heartbeat_at__lt=since).count()


def reviews_waiting(*, now: datetime) -> tuple[int, float]:
    """Done runs whose change review is due (its task not done yet) and how long the oldest
    has been due (seconds)."""
    row = ReviewDue.objects.aggregate(n=Count("quantum_run_id"), oldest=Min("due_at"))
    oldest = row["oldest"]
    return int(row["n"]), (now - oldest).total_seconds() if oldest is not None else 0.0


def questions_pending(*, now: datetime) -> tuple[int, float]:
    """Pending Tether questions and how long the oldest has waited (seconds)."""
    row = Reaching.objects.filter(status=ReachingStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    oldest = row["oldest"]
    return int(row["n"]), (now - oldest).total_seconds() if oldest is not None else 0.0


@dataclass(frozen=True)
class EndpointHealthRow:
    endpoint: str  # the registry's name; for a model routed without the registry, the model
    provider: str
    model: str
    up: bool
    failures: int  # in a row
    in_flight: int  # model calls holding one of its slots (registry endpoints)


def endpoints_health() -> list[EndpointHealthRow]:
    """The registry's enabled endpoints (its own state read: down marks, failures in a row,
    calls in flight), then the models routed without the registry (the configured tiers, and
    any other with failures in a row), each up or down."""
    states = endpoints_state(registry_enabled())
    rows = [
        EndpointHealthRow(
            endpoint=s.conf.name,
            provider=s.conf.provider,
            model=s.conf.model,
            up=not s.down,
            failures=s.failures,
            in_flight=s.in_flight,
        )
        for s in states
    ]
    registry_keys = {s.conf.health_key for s in states}
    failing = {
        (h.provider, h.model): h
        for h in endpoints_failing()
        if (h.provider, h.model) not in registry_keys
    }
    provider = settings.PSYCHONAUTS_PROVIDER or "anthropic"
    builtin = sorted({(provider, m) for m in settings.PSYCHONAUTS_MODELS.values()} | set(failing))
    down = endpoints_down(builtin)
    for p, m in builtin:
        health = failing.get((p, m))
        rows.append(
            EndpointHealthRow(
                endpoint=m,
                provider=p,
                model=m,
                up=(p, m) not in down and not (health is not None and health.down_until),
                failures=health.failures if health is not None else 0,
                in_flight=0,
            )
        )
    return rows


def figures_now(*, now: datetime | None = None) -> Figures:
    now = now or timezone.now()
    depths = queue_depths()
    agents = agents_by_status()
    pending, oldest = questions_pending(now=now)
    due, due_oldest = reviews_waiting(now=now)
    totals = metrics.counter_totals()
    return {
        "queue_depth": float(sum(depths.values())),
        "queue_depth_max": float(max(depths.values(), default=0)),
        "agents_pending": float(agents[AgentStatus.PENDING]),
        "agents_running": float(agents[AgentStatus.RUNNING]),
        "agents_waiting": float(agents[AgentStatus.WAITING]),
        "agents_stuck": float(agents_stuck(now=now)),
        "questions_pending": float(pending),
        "question_oldest_s": oldest,
        "reviews_due": float(due),
        "review_oldest_s": due_oldest,
        "endpoints_down": float(sum(1 for e in endpoints_health() if not e.up)),
        "errors_total": totals.get("annihilation_errors_total", 0.0),
        "cost_usd_total": totals.get("annihilation_cost_usd_total", 0.0),
        "tokens_total": totals.get("annihilation_tokens_total", 0.0),
        "prompt_tokens_total": totals.get("annihilation_prompt_tokens_total", 0.0),
        "cache_read_tokens_total": totals.get("annihilation_cache_read_tokens_total", 0.0),
    }


def idle_queues(depths: dict[str, int], *, timeout: float | None = None) -> dict[str, int]:
    """The queues with tasks waiting that no answering worker consumes (asks the workers only
    when some task waits)."""
    waiting = {name: n for name, n in depths.items() if n > 0}
    if not waiting:
        return {}
    consumed = {q for queues in workers_consuming(timeout=timeout).values() for q in queues}
    return {name: n for name, n in waiting.items() if name not in consumed}


class IdleWork(TypedDict):
    waiting: int  # tasks queued where no worker consumes them
    agents_pending: int
    queues: dict[str, int]


def idle_work(*, depths: dict[str, int] | None = None) -> IdleWork | None:
    """Work waiting with nobody to do it (the dashboard's warning), or None. What the workers
    consume is read from their heartbeat notes (`workers_consuming_seen`), only when something
    waits. `depths`: the queue depths when the caller has just read them (the dashboard's
    summary has)."""
    depths = queue_depths() if depths is None else depths
    if not any(depths.values()):
        return None  # nothing queued: whatever waits is not waiting for a worker
    pending = AgentRun.objects.filter(status=AgentStatus.PENDING).count()
    consumers = workers_consuming_seen()
    consumed = {q for queues in consumers.values() for q in queues}
    idle = {name: n for name, n in depths.items() if n > 0 and name not in consumed}
    if not idle and consumers:
        return None
    return {"waiting": sum(idle.values()), "agents_pending": pending, "queues": idle}


def operations_card(*, depths: dict[str, int | None] | None = None) -> dict[str, object]:
    """What templates/operations/_card.html needs (the dashboard includes it); `depths` as
    `celery_queue_depths` returns them, when the caller has them."""
    known = None if depths is None else {name: n or 0 for name, n in depths.items()}
    return {"alerts_firing": alerts_firing(), "idle_work": idle_work(depths=known)}


# --- the Prometheus collector ------------------------------------------------------------


class StateCollector:
    """The gauges read at scrape time (the counters and histograms come from the files)."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        depth = GaugeMetricFamily(
            "annihilation_queue_depth", "Tasks waiting in a Celery queue.", labels=["queue"]
        )
        for name, n in queue_depths().items():
            depth.add_metric([name], n)
        yield depth
        agents = GaugeMetricFamily(
            "annihilation_agents", "Agents not yet ended, by status.", labels=["status"]
        )
        for status, n in agents_by_status().items():
            agents.add_metric([status], n)
        yield agents
        yield GaugeMetricFamily(
            "annihilation_agents_stuck",
            "Running agents without a heartbeat for ALERT_STUCK_AFTER_S.",
            value=agents_stuck(now=now),
        )
        pending, oldest = questions_pending(now=now)
        yield GaugeMetricFamily(
            "annihilation_tether_questions_pending", "Questions waiting for the Tether.", pending
        )
        yield GaugeMetricFamily(
            "annihilation_tether_oldest_wait_seconds",
            "How long the oldest pending Tether question has waited.",
            oldest,
        )
        due, due_oldest = reviews_waiting(now=now)
        yield GaugeMetricFamily(
            "annihilation_tether_reviews_due",
            "Done runs whose change review has not been made yet.",
            due,
        )
        yield GaugeMetricFamily(
            "annihilation_tether_review_oldest_due_seconds",
            "How long the oldest of the change reviews due has been due.",
            due_oldest,
        )
        labels = ["endpoint", "provider", "model"]
        up = GaugeMetricFamily(
            "annihilation_endpoint_up",
            "1 when a model endpoint is usable, 0 when marked down.",
            labels=labels,
        )
        failures = GaugeMetricFamily(
            "annihilation_endpoint_failures",
            "Failures in a row of a model endpoint.",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "annihilation_endpoint_in_flight",
            "Model calls holding one of a registry endpoint's slots.",
            labels=labels,
        )
        for e in endpoints_health():
            names = [e.endpoint, e.provider, e.model]
            up.add_metric(names, 1 if e.up else 0)
            failures.add_metric(names, e.failures)
            in_flight.add_metric(names, e.in_flight)
        yield up
        yield failures
        yield in_flight
        firing = GaugeMetricFamily(
            "annihilation_alert_firing", "1 while an alert rule fires.", labels=["rule"]
        )
        for rule in alerts_firing_rules():
            firing.add_metric([rule], 1)
        yield firing


# --- alerts and samples ------------------------------------------------------------------


def alerts_firing_rules() -> list[str]:
    return list(
        Alert.objects.filter(status=AlertStatus.FIRING)
        .order_by("rule")
        .values_list("rule", flat=True)
    )


def alerts_firing() -> list[Alert]:
    return list(Alert.objects.filter(status=AlertStatus.FIRING).order_by("fired_at"))


def alerts_all() -> list[Alert]:
    return list(Alert.objects.order_by("rule"))


def alert_history(*, limit: int = 50) -> list[AlertTransition]:
    return list(
        AlertTransition.objects.select_related("alert").order_by("-created_at", "-id")[:limit]
    )


def samples_since(since: datetime) -> list[MetricSample]:
    return list(MetricSample.objects.filter(at__gte=since).order_by("at"))


def sample_at_or_after(since: datetime) -> MetricSample | None:
    """The oldest sample of a window: the base a rate over the window is measured from."""
    return MetricSample.objects.filter(at__gte=since).order_by("at").first()


class Chart(TypedDict):
    name: str
    label: str
    last: float
    peak: float
    points: str  # an SVG polyline's points, in a WIDTH x HEIGHT box
    empty: bool


CHART_WIDTH = 300
CHART_HEIGHT = 60
CHARTS: tuple[tuple[str, str], ...] = (
    ("queue_depth", "tasks waiting"),
    ("agents_running", "agents running"),
    ("agents_pending", "agents pending"),
    ("questions_pending", "Tether questions"),
    ("errors_total", "errors (total)"),
    ("cost_usd_total", "spend, USD (total)"),
)


def charts_last_hour(*, now: datetime | None = None) -> list[Chart]:
    """One polyline per charted figure over the last hour (time on x, 0..peak on y)."""
    now = now or timezone.now()
    span = settings.OPERATIONS_SAMPLES_KEEP_S
    start = now - timedelta(seconds=span)
    samples = samples_since(start)
    charts: list[Chart] = []
    for name, label in CHARTS:
        series = [(s.at, float(s.values.get(name, 0.0))) for s in samples]
        peak = max((v for _, v in series), default=0.0)
        points = " ".join(
            f"{(at - start).total_seconds() / span * CHART_WIDTH:.1f},"
            f"{CHART_HEIGHT - (v / peak * CHART_HEIGHT if peak else 0):.1f}"
            for at, v in series
        )
        charts.append(
            {
                "name": name,
                "label": label,
                "last": series[-1][1] if series else 0.0,
                "peak": peak,
                "points": points,
                "empty": not series,
            }
        )
    return charts


class RuleRow(TypedDict):
    rule: str
    threshold: float
    cooldown_s: float
    status: str


def rule_rows() -> list[RuleRow]:
    """Every rule with its settings and state (`ok` when it never fired)."""
    states = dict(Alert.objects.values_list("rule", "status"))
    return [
        {
            "rule": rule,
            "threshold": float(limits["threshold"]),
            "cooldown_s": float(limits["cooldown_s"]),
            "status": states.get(rule, "ok"),
        }
        for rule, limits in settings.ALERT_RULES.items()
    ]
