"""Outgoing webhooks: the outbox reads the event stream after its cursor and records one
delivery per event and subscribed endpoint; each delivery is a signed POST sent by a Celery
task, tried again with exponential backoff until it is delivered or out of attempts.

Nothing is lost across restarts: the deliveries are rows written in the transaction that moves
the cursor, and a delivery whose task was lost (a worker killed) is sent again by the sweep.
Each event reaches an endpoint once (a unique constraint), however often the stream is re-read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.celery import app
from core.destinations import DestinationRefused, destination_check, pinned_opener
from core.models import Event
from core.redaction import redact
from hooks.events import TOPICS, hook_event_for
from hooks.models import (
    DeliveryStatus,
    OutboxCursor,
    WebhookDelivery,
    WebhookEndpoint,
)

logger = logging.getLogger(__name__)

CURSOR = "webhooks"
DELIVER_TASK = "hooks.deliver"
SIGNATURE_HEADER = "X-Annihilation-Signature-256"
DELIVERY_HEADER = "X-Annihilation-Delivery"
TIMESTAMP_HEADER = "X-Annihilation-Timestamp"
EVENT_HEADER = "X-Annihilation-Event"
# An id drawn before a later one was drawn by a transaction that had begun by then; the event's
# created_at is taken just before its INSERT, so this much slack covers the gap between the two.
_DRAW_SLACK = timedelta(seconds=2)

S = DeliveryStatus


def sign(secret: bytes, body: bytes) -> str:
    """The signature header's value: `sha256=` and the HMAC-SHA256 of the body, in hex."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


# --- the outbox ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxScan:
    read: int  # events read after the cursor
    created: list[int]  # deliveries recorded (their tasks go out after commit)
    cursor: int  # where the cursor stands now
    busy: bool = False  # another scan held the cursor


def _cursor_locked() -> OutboxCursor | None:
    """The cursor row, locked; None when another scan holds it. A new cursor starts at the end
    of the stream: endpoints get what happens from now on, not the history."""
    table, events = OutboxCursor._meta.db_table, Event._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, last_event_id, updated_at)"
            f" SELECT %s, coalesce(max(id), 0), now() FROM {events}"
            " ON CONFLICT (name) DO NOTHING",
            [CURSOR],
        )
    return OutboxCursor.objects.select_for_update(skip_locked=True).filter(name=CURSOR).first()


def _oldest_open_transaction() -> datetime | None:
    """When the oldest other transaction that has written something began (it may hold an
    event id it has not committed yet)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(xact_start) FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
            " AND pid <> pg_backend_pid() AND datname = current_database()"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _body(delivery_id: uuid.UUID, event: str, row: Mapping[str, Any]) -> str:
    return json.dumps(
        {
            "id": str(delivery_id),
            "event": event,
            "event_id": row["id"],
            "created_at": row["created_at"].isoformat(),
            "data": row["data"],
        },
        separators=(",", ":"),
        sort_keys=True,
    )


@transaction.atomic
def outbox_scan(*, limit: int | None = None) -> OutboxScan:
    """Record the deliveries of the events after the cursor and move it.

    Event ids are drawn when a row is inserted, not when it commits: an id below one already
    seen may still commit. The cursor therefore moves only over ids with no gap before them, or
    past a gap no open transaction can fill (none that began before the event after the gap), or
    one older than HOOKS_OUTBOX_GAP_S (a rolled-back id). Events past a gap are delivered at once
    all the same; the next scan reads them again and records nothing twice.
    """
    cursor = _cursor_locked()
    if cursor is None:
        return OutboxScan(0, [], -1, busy=True)
    now = timezone.now()
    # Every id after the cursor (to see the gaps), and the rows of the webhook topics among them
    # in a second statement on event_topic_seq: the agents' many events are not read whole.
    seen = list(
        Event.objects.filter(id__gt=cursor.last_event_id)
        .order_by("id")
        .values_list("id", "created_at")[: limit or settings.HOOKS_OUTBOX_BATCH]
    )
    last = cursor.last_event_id
    if seen:
        last = _contiguous_end(cursor.last_event_id, seen, now)
        # Read after the look at open transactions: one that committed in between, and so
        # settled its gap, has its rows here.
        rows = Event.objects.filter(
            topic__in=TOPICS, id__gt=cursor.last_event_id, id__lte=seen[-1][0]
        ).values("id", "topic", "type", "created_at", "payload")
        made = _deliveries(rows, now)
    else:
        made = []
    created: list[int] = []
    if made:
        WebhookDelivery.objects.bulk_create(made, ignore_conflicts=True)
        # Only the rows this scan inserted carry its delivery ids (a conflict inserted nothing).
        created = list(
            WebhookDelivery.objects.filter(
                delivery_id__in=[d.delivery_id for d in made]
            ).values_list("pk", flat=True)
        )
        _send_on_commit(created)
    if last != cursor.last_event_id:
        OutboxCursor.objects.filter(pk=cursor.pk).update(last_event_id=last, updated_at=now)
    return OutboxScan(len(seen), created, last)


def _contiguous_end(after: int, seen: list[tuple[int, datetime]], now: datetime) -> int:
    """The last id the cursor may move to: up to the first gap that an open transaction may
    still fill."""
    oldest_open = _oldest_open_transaction()
    gap_limit = now - timedelta(seconds=settings.HOOKS_OUTBOX_GAP_S)
    last = after
    for event_id, created_at in seen:
        if event_id != last + 1:
            settled = (
                oldest_open is None
                or oldest_open > created_at + _DRAW_SLACK
                or created_at < gap_limit
            )
            if not settled:
                break
        last = event_id
    return last


def _deliveries(rows: Iterable[Mapping[str, Any]], now: datetime) -> list[WebhookDelivery]:
    """One delivery per webhook event and active endpoint that chose it (and existed then)."""
    endpoints = list(WebhookEndpoint.objects.filter(active=True).only("events", "created_at"))
    made: list[WebhookDelivery] = []
    for row in rows:
        event = hook_event_for(row["topic"], row["type"], row["payload"] or {})
        if event is None:
            continue
        for endpoint in endpoints:
            if event in endpoint.events and endpoint.created_at <= row["created_at"]:
                delivery_id = uuid.uuid4()
                made.append(
                    WebhookDelivery(
                        endpoint_id=endpoint.pk,
                        event_id=row["id"],
                        event=event,
                        delivery_id=delivery_id,
                        body=_body(delivery_id, event, {**row, "data": row["payload"]}),
                        next_try_at=now,
                    )
                )
    return made


def _send_on_commit(delivery_ids: list[int]) -> None:
    def send() -> None:
        for pk in delivery_ids:
            app.send_task(DELIVER_TASK, args=(pk,))

    transaction.on_commit(send)


def deliveries_resend_due() -> list[int]:
    """Send again the deliveries whose task was lost: waiting past their next try by
    HOOKS_SWEEP_GRACE_S (a retry's own task is due at its next try), or `sending` past the
    attempt's deadline (its worker died). The claim in `delivery_attempt` lets one task through."""
    before = timezone.now() - timedelta(seconds=settings.HOOKS_SWEEP_GRACE_S)
    due = list(
        WebhookDelivery.objects.filter(
            status__in=[S.PENDING, S.RETRYING, S.SENDING], next_try_at__lt=before
        )
        .order_by("next_try_at")
        .values_list("pk", flat=True)[: settings.HOOKS_OUTBOX_BATCH]
    )
    for pk in due:
        app.send_task(DELIVER_TASK, args=(pk,))
    return due


# --- one delivery -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryResult:
    """What an attempt came to: `retry_in_s` set when the delivery is to be tried again."""

    status: str  # a DeliveryStatus, SKIPPED or SUPERSEDED
    attempts: int = 0
    retry_in_s: float | None = None


SKIPPED = "skipped"  # not claimed: finished, or held by another attempt
SUPERSEDED = "superseded"  # claimed, but a later attempt took the delivery before the answer


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt: base * 2^(attempts-1), capped."""
    base, cap = settings.HOOKS_RETRY_BASE_S, settings.HOOKS_RETRY_MAX_S
    return float(min(cap, base * 2 ** max(0, attempts - 1)))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is the endpoint's answer, not a place to send the signed body to."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str]:
    """POST to an allowed address of the URL's host, the one checked (core.destinations);
    (status code, error) — error empty on a 2xx."""
    try:
        addresses = destination_check(
            url,
            allow_private=settings.HOOKS_ALLOW_PRIVATE,
            setting="ANNIHILATION_WEBHOOKS_ALLOW_PRIVATE",
        )
    except DestinationRefused as exc:
        return None, f"refused: {exc}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        opener = pinned_opener(addresses, _NoRedirects())
        with opener.open(request, timeout=settings.HOOKS_TIMEOUT_S) as response:
            response.read(4096)
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code} {exc.reason}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, bad URL
        return None, f"{type(exc).__name__}: {exc}"


def _claim(delivery_id: int) -> WebhookDelivery | None:
    """Take the delivery for one attempt (compare-and-set on status and attempts); None when it
    is finished, or another task has it."""
    row = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_id).first()
    if row is None or row.status in (S.DELIVERED, S.FAILED):
        return None
    now = timezone.now()
    deadline = now + timedelta(seconds=settings.HOOKS_TIMEOUT_S + settings.HOOKS_SWEEP_GRACE_S)
    claimed = (
        WebhookDelivery.objects.filter(pk=delivery_id, attempts=row.attempts)
        .filter(Q(status__in=[S.PENDING, S.RETRYING]) | Q(status=S.SENDING, next_try_at__lt=now))
        .update(status=S.SENDING, attempts=row.attempts + 1, next_try_at=deadline)
    )
    if claimed != 1:
        return None
    row.attempts += 1
    return row


def delivery_attempt(*, delivery_id: int) -> DeliveryResult:
    """One signed POST of the delivery; records the answer. A failure before the last attempt
    leaves it `retrying` with its next try; the last one leaves it `failed`."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return DeliveryResult(status=SKIPPED)
    endpoint = delivery.endpoint
    body = delivery.body.encode()
    secret = os.environ.get(endpoint.secret_env, "")
    code: int | None = None
    if not endpoint.active:
        error = "the endpoint is inactive"
    elif not secret:
        error = f"the signing secret's environment variable {endpoint.secret_env} is not set"
    else:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Annihilation-Hookshot",
            SIGNATURE_HEADER: sign(secret.encode(), body),
            DELIVERY_HEADER: str(delivery.delivery_id),
            TIMESTAMP_HEADER: str(int(time.time())),
            EVENT_HEADER: delivery.event,
        }
        code, error = _post(endpoint.url, body, headers)
    now = timezone.now()
    base = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=S.SENDING, attempts=delivery.attempts
    )
    if not error:
        if not _record(base, delivery, status=S.DELIVERED, status_code=code, error="",
                       delivered_at=now, next_try_at=None):  # fmt: skip
            return DeliveryResult(SUPERSEDED, delivery.attempts)
        logger.info("webhook %s delivered to %s", delivery.delivery_id, endpoint.name,
                    extra={"delivery_id": str(delivery.delivery_id), "status_code": code})  # fmt: skip
        return DeliveryResult(S.DELIVERED, delivery.attempts)
    error = redact(error)[:1000]
    if delivery.attempts >= settings.HOOKS_MAX_ATTEMPTS or not endpoint.active:
        if not _record(base, delivery, status=S.FAILED, status_code=code, error=error,
                       next_try_at=None):  # fmt: skip
            return DeliveryResult(SUPERSEDED, delivery.attempts)
        logger.warning("webhook %s to %s failed after %d attempts: %s", delivery.delivery_id,
                       endpoint.name, delivery.attempts, error)  # fmt: skip
        return DeliveryResult(S.FAILED, delivery.attempts)
    wait = backoff_s(delivery.attempts)
    if not _record(base, delivery, status=S.RETRYING, status_code=code, error=error,
                   next_try_at=now + timedelta(seconds=wait)):  # fmt: skip
        return DeliveryResult(SUPERSEDED, delivery.attempts)
    logger.info("webhook %s to %s: attempt %d failed (%s); next in %.1f s", delivery.delivery_id,
                endpoint.name, delivery.attempts, error, wait)  # fmt: skip
    return DeliveryResult(S.RETRYING, delivery.attempts, retry_in_s=wait)


def _record(claimed: QuerySet[WebhookDelivery], delivery: WebhookDelivery, **fields: Any) -> bool:
    """Write the attempt's answer if this attempt still holds the delivery (compare-and-set on
    `sending` and its attempt count). False when it does not: the attempt outlived its deadline
    and the sweep gave the delivery to a later attempt, whose answer is the one that counts (and
    whose task retries it, not this one's)."""
    if claimed.update(**fields) == 1:
        return True
    logger.warning(
        "webhook %s: attempt %d answered after a later attempt took the delivery; its answer"
        " (%s) is not recorded",
        delivery.delivery_id,
        delivery.attempts,
        fields["status"],
        extra={"delivery_id": str(delivery.delivery_id), "attempt": delivery.attempts},
    )
    return False
