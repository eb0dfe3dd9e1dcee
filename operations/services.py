"""Writes: the alerter's tick (samples, alert transitions) and its pruning.

Every alert transition is a compare-and-set on the alert's status; a transition recorded is
also a row of history and an event on the `alerts` topic (`alert_fired`, `alert_resolved`),
which outgoing webhooks deliver from the events table.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from core import metrics
from core.events import publish
from operations.events import ALERTS_TOPIC, AlertEventType, AlertPayload
from operations.models import Alert, AlertStatus, AlertTransition, MetricSample
from operations.rules import Reading, no_worker_reading, readings
from operations.selectors import figures_now, idle_queues, queue_depths, sample_at_or_after

logger = logging.getLogger(__name__)


def alert_payload(alert: Alert) -> AlertPayload:
    return {
        "rule": alert.rule,
        "status": alert.status,
        "value": alert.value,
        "threshold": alert.threshold,
        "message": alert.message,
        "fired_at": alert.fired_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "fire_count": alert.fire_count,
    }


def _record(alert: Alert, now: datetime) -> None:
    AlertTransition.objects.create(
        alert=alert, status=alert.status, value=alert.value, message=alert.message, created_at=now
    )
    event = (
        AlertEventType.ALERT_FIRED
        if alert.status == AlertStatus.FIRING
        else AlertEventType.ALERT_RESOLVED
    )
    publish(ALERTS_TOPIC, event, alert_payload(alert))
    logger.warning(
        "alert %s %s: %s",
        alert.rule,
        alert.status,
        alert.message,
        extra={"alert": alert.rule, "status": alert.status, "value": alert.value},
    )


@transaction.atomic
def alert_fire(*, reading: Reading, now: datetime) -> Alert | None:
    """Fire the reading's rule: new -> firing, or resolved -> firing once its cooldown since the
    last firing has passed. None when nothing changed (firing already, cooling down, or
    another tick fired it first)."""
    cooldown = timedelta(seconds=float(settings.ALERT_RULES[reading.rule]["cooldown_s"]))
    alert = Alert.objects.filter(rule=reading.rule).first()
    fields = {
        "value": reading.value,
        "threshold": reading.threshold,
        "message": reading.message,
    }
    if alert is None:
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    rule=reading.rule, status=AlertStatus.FIRING, fired_at=now, **fields
                )
        except IntegrityError:
            return None  # another tick created it meanwhile
    else:
        if alert.status == AlertStatus.FIRING or now - alert.fired_at < cooldown:
            return None
        updated = Alert.objects.filter(pk=alert.pk, status=AlertStatus.RESOLVED).update(
            status=AlertStatus.FIRING,
            fired_at=now,
            resolved_at=None,
            fire_count=F("fire_count") + 1,
            **fields,
        )
        if updated != 1:
            return None  # another tick fired it meanwhile
        alert.refresh_from_db()
    _record(alert, now)
    return alert


@transaction.atomic
def alert_resolve(*, reading: Reading, now: datetime) -> Alert | None:
    """firing -> resolved; None when the rule was not firing."""
    updated = Alert.objects.filter(rule=reading.rule, status=AlertStatus.FIRING).update(
        status=AlertStatus.RESOLVED, resolved_at=now, value=reading.value, message=reading.message
    )
    if updated != 1:
        return None
    alert = Alert.objects.get(rule=reading.rule)
    _record(alert, now)
    return alert


def alerts_apply(found: list[Reading], *, now: datetime) -> list[Alert]:
    """Fire the breached rules and resolve the others; returns the alerts that changed."""
    changed = []
    for reading in found:
        alert = (
            alert_fire(reading=reading, now=now)
            if reading.breached
            else alert_resolve(reading=reading, now=now)
        )
        if alert is not None:
            changed.append(alert)
    return changed


def sample_record(*, values: dict[str, float], now: datetime) -> MetricSample:
    return MetricSample.objects.create(at=now, values=values)


def samples_prune(*, now: datetime) -> int:
    keep = timedelta(seconds=settings.OPERATIONS_SAMPLES_KEEP_S)
    deleted, _ = MetricSample.objects.filter(at__lt=now - keep).delete()
    return deleted


def operations_tick(*, now: datetime | None = None) -> list[Alert]:
    """One beat of the alerter: fold dead processes' metric files, look at the system, measure
    the rates over the window's samples, record this sample, apply the rules, prune."""
    now = now or timezone.now()
    metrics.files_compact()
    figures = figures_now(now=now)
    idle = idle_queues(queue_depths())
    base = sample_at_or_after(now - timedelta(seconds=settings.ALERT_WINDOW_S))
    found = readings(figures, idle=idle, base=base, now=now)
    values = cast(dict[str, float], dict(figures))
    values["idle_tasks"] = float(sum(idle.values()))
    sample_record(values=values, now=now)
    changed = alerts_apply(found, now=now)
    samples_prune(now=now)
    return changed


def no_worker_check() -> list[Alert]:
    """The no_worker rule alone (the beat process runs it: it needs no worker to ask)."""
    return alerts_apply([no_worker_reading(idle_queues(queue_depths()))], now=timezone.now())
