"""Outgoing webhooks: the outbox turns the event stream into deliveries (each event once per
endpoint, nothing lost to ids that commit out of order), and each delivery is a signed POST to a
real local HTTP server, retried with exponential backoff."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from core.events import publish
from core.models import Event
from hooks.models import DeliveryStatus, OutboxCursor, WebhookDelivery, WebhookEndpoint
from hooks.services.endpoints import endpoint_save
from hooks.services.outgoing import (
    backoff_s,
    deliveries_resend_due,
    delivery_attempt,
    outbox_scan,
)

SECRET_ENV = "HOOKS_TEST_SIGNING_SECRET"
SECRET = "out-signing-secret-Zy98xw"


@pytest.fixture
def signing(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Any:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    settings.HOOKS_RETRY_BASE_S = 0.1
    settings.HOOKS_MAX_ATTEMPTS = 3
    settings.HOOKS_TIMEOUT_S = 5
    return settings


def endpoint(url: str, events: list[str], name: str = "ops") -> WebhookEndpoint:
    return endpoint_save(
        endpoint=WebhookEndpoint(name=name, url=url, secret_env=SECRET_ENV, events=events)
    )


def start_outbox() -> None:
    """The cursor starts at the end of the stream (what came before is not delivered)."""
    outbox_scan()


@pytest.mark.django_db
def test_it_delivers_a_chosen_event_signed(receiver, signing, django_capture_on_commit_callbacks):
    hook = endpoint(receiver.url, ["wave.completed", "change.submitted"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 12, "status": "done"})
    publish("burst:events", "burst_started", {"wave_id": 12})  # not a webhook event
    publish("tether:reaching", "question_asked", {"reaching_id": 3})  # not chosen
    scan = outbox_scan()
    assert scan.read == 3 and len(scan.created) == 1
    delivery = WebhookDelivery.objects.get()
    assert (delivery.endpoint_id, delivery.event) == (hook.pk, "wave.completed")

    assert delivery_attempt(delivery_id=delivery.pk).status == DeliveryStatus.DELIVERED
    request = receiver.wait(1)[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Annihilation-Signature-256"] == expected
    assert request.headers["X-Annihilation-Delivery"] == str(delivery.delivery_id)
    assert request.headers["X-Annihilation-Event"] == "wave.completed"
    assert abs(int(request.headers["X-Annihilation-Timestamp"]) - time.time()) < 60
    body = json.loads(request.body)
    assert body["event"] == "wave.completed" and body["data"] == {"wave_id": 12, "status": "done"}
    assert body["id"] == str(delivery.delivery_id)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.status_code) == ("delivered", 1, 200)


@pytest.mark.django_db
def test_it_maps_each_webhook_event(receiver, signing):
    endpoint(
        receiver.url, ["wave.completed", "reaching.created", "change.submitted", "alert.fired"]
    )
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    publish("tether:reaching", "question_asked", {"reaching_id": 2})
    publish("tether:drifts", "change_review_created", {"change_id": 3, "status": "pending"})
    publish("tether:drifts", "change_review_created", {"change_id": 4, "status": "merged"})
    publish("alerts", "alert_fired", {"rule": "queue_backlog", "value": 120.0})
    publish("alerts", "alert_resolved", {"rule": "queue_backlog", "value": 3.0})
    outbox_scan()
    events = sorted(WebhookDelivery.objects.values_list("event", flat=True))
    assert events == ["alert.fired", "change.submitted", "reaching.created", "wave.completed"]


@pytest.mark.django_db
def test_it_records_each_event_once_per_endpoint(receiver, signing):
    endpoint(receiver.url, ["wave.completed"], name="a")
    endpoint(receiver.url, ["wave.completed"], name="b")
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    assert len(outbox_scan().created) == 2
    # Read again from the start: nothing new.
    OutboxCursor.objects.update(last_event_id=0)
    assert outbox_scan().created == []
    assert WebhookDelivery.objects.count() == 2


@pytest.mark.django_db
def test_a_new_endpoint_gets_what_happens_from_then_on(receiver, signing):
    publish("burst:events", "wave_completed", {"wave_id": 1})
    start_outbox()
    endpoint(receiver.url, ["wave.completed"])
    assert outbox_scan().created == []


@pytest.mark.django_db
def test_it_backs_off_and_fails_after_the_last_attempt(receiver, signing):
    receiver.statuses = [500, 503, 500]
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    (pk,) = outbox_scan().created
    first = delivery_attempt(delivery_id=pk)
    assert (first.status, first.retry_in_s) == ("retrying", backoff_s(1))
    row = WebhookDelivery.objects.get()
    assert (row.status_code, row.error, row.attempts) == (500, "HTTP 500 Internal Server Error", 1)
    assert row.next_try_at is not None
    assert delivery_attempt(delivery_id=pk).retry_in_s == backoff_s(2) == 2 * backoff_s(1)
    assert delivery_attempt(delivery_id=pk).status == "failed"
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("failed", 3) and row.next_try_at is None
    assert delivery_attempt(delivery_id=pk).status == "skipped"  # finished: left alone
    assert len(receiver.requests) == 3


@pytest.mark.django_db
def test_a_missing_secret_is_a_failed_attempt_with_the_reason(receiver, signing, monkeypatch):
    monkeypatch.delenv(SECRET_ENV)
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    (pk,) = outbox_scan().created
    assert delivery_attempt(delivery_id=pk).status == "retrying"
    assert SECRET_ENV in WebhookDelivery.objects.get().error
    assert receiver.requests == []


@pytest.mark.django_db
def test_it_refuses_an_endpoint_with_a_bad_url_secret_name_or_event():
    from django.core.exceptions import ValidationError

    fields: dict[str, Any]
    for fields in (
        {"url": "ftp://example.com/x"},
        {"secret_env": "my secret value"},
        {"events": ["wave.started"]},
        {"events": []},
    ):
        values = {"name": "x", "url": "https://example.com/hook", "secret_env": "HOOK_SECRET",
                  "events": ["wave.completed"], **fields}  # fmt: skip
        with pytest.raises(ValidationError):
            endpoint_save(endpoint=WebhookEndpoint(**values))
    assert not WebhookEndpoint.objects.exists()


INTERNAL_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.170.2/v2/credentials",
    "http://[fd00:ec2::254]/latest/",
    "http://[::ffff:169.254.169.254]/hook",
    "http://[fe80::1]/hook",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://0.0.0.0:8080/hook",
]
PRIVATE_URLS = [
    "http://127.0.0.1:8080/hook",
    "http://localhost:8080/hook",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://[::1]:8080/hook",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_it_never_takes_a_metadata_or_link_local_url(url, settings):
    from django.core.exceptions import ValidationError

    settings.HOOKS_ALLOW_PRIVATE = True  # not even with private addresses allowed
    with pytest.raises(ValidationError) as refused:
        endpoint(url, ["wave.completed"])
    assert "url" in refused.value.message_dict
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_a_loopback_or_private_url_needs_the_opt_in(url, settings):
    from django.core.exceptions import ValidationError

    settings.HOOKS_ALLOW_PRIVATE = False
    with pytest.raises(ValidationError) as refused:
        endpoint(url, ["wave.completed"])
    assert "ANNIHILATION_WEBHOOKS_ALLOW_PRIVATE" in str(refused.value)
    settings.HOOKS_ALLOW_PRIVATE = True
    assert endpoint(url, ["wave.completed"]).pk


@pytest.mark.django_db
def test_the_admin_form_shows_the_refusal_on_the_url(admin_client, settings):
    settings.HOOKS_ALLOW_PRIVATE = False
    page = admin_client.post(
        "/admin/hooks/webhookendpoint/add/",
        {"name": "meta", "url": "http://169.254.169.254/hook", "secret_env": SECRET_ENV,
         "events": ["wave.completed"], "active": "on"},
    )  # fmt: skip
    assert page.status_code == 200  # the form again, with the error
    assert "cloud metadata" in page.content.decode()
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
def test_a_delivery_is_not_sent_to_an_address_no_longer_allowed(receiver, signing, settings):
    endpoint(receiver.url, ["wave.completed"])  # allowed (a developer machine's default)
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1, "status": "done"})
    outbox_scan()
    delivery = WebhookDelivery.objects.get()
    settings.HOOKS_ALLOW_PRIVATE = False

    assert delivery_attempt(delivery_id=delivery.pk).status == DeliveryStatus.RETRYING
    delivery.refresh_from_db()
    assert "refused" in delivery.error and "ANNIHILATION_WEBHOOKS_ALLOW_PRIVATE" in delivery.error
    settings.HOOKS_ALLOW_PRIVATE = True
    assert delivery_attempt(delivery_id=delivery.pk).status == DeliveryStatus.DELIVERED
    assert len(receiver.wait(1)) == 1  # the refused attempt never reached it


def test_a_request_goes_to_the_address_checked_not_to_a_new_lookup(receiver):
    """The name is resolved once, checked, and connected to as checked: a name that resolves
    elsewhere by the time of the connection (DNS rebinding) moves nothing."""
    import urllib.request

    from core.destinations import destination_check, pinned_opener

    checked = destination_check(receiver.url, allow_private=True)
    port = receiver.url.split(":")[2].split("/")[0]
    # A name no resolver knows: only the pinned address can be connected to.
    request = urllib.request.Request(f"http://rebound.invalid:{port}/hook", data=b"{}")
    with pinned_opener(checked).open(request, timeout=5) as response:
        assert response.status == 200
    assert receiver.wait(1)[0].headers["Host"] == f"rebound.invalid:{port}"


@pytest.mark.django_db(transaction=True)
def test_it_waits_for_an_id_drawn_earlier_that_commits_later(receiver, signing):
    """An event whose id was drawn before a later one's, committed after it, is not skipped."""
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    db = connection.settings_dict
    late = psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=False
    )
    try:
        payload = json.dumps({"wave_id": 1})
        inserted = late.execute(
            f"INSERT INTO {Event._meta.db_table} (topic, type, payload, created_at)"
            " VALUES ('burst:events', 'wave_completed', %s::jsonb, now()) RETURNING id",
            [payload],
        ).fetchone()
        assert inserted is not None
        late_id = inserted[0]
        publish("burst:events", "wave_completed", {"wave_id": 2})  # a later id, committed
        first = outbox_scan()
        assert len(first.created) == 1
        assert first.cursor < late_id  # held before the id still in flight
        late.commit()
    finally:
        late.close()
    second = outbox_scan()
    assert len(second.created) == 1
    assert WebhookDelivery.objects.get(event_id=late_id)
    assert second.cursor > late_id


@pytest.mark.django_db(transaction=True)
def test_it_moves_past_an_id_that_was_rolled_back(receiver, signing):
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                         dbname=db["NAME"]) as gone:  # fmt: skip
        gone.execute(
            f"INSERT INTO {Event._meta.db_table} (topic, type, payload, created_at)"
            " VALUES ('quanta', 'x', '{}'::jsonb, now())"
        )
        gone.rollback()
    publish("burst:events", "wave_completed", {"wave_id": 2})
    scan = outbox_scan()
    assert len(scan.created) == 1
    assert scan.cursor == Event.objects.latest("id").pk


@pytest.mark.django_db(transaction=True)
def test_a_worker_delivers_with_backoff_from_the_beat(receiver, make_worker, tmp_path):
    """The real thing: a Celery worker with its beat reads the stream, sends, is refused twice
    and delivers on the third attempt after waiting longer each time; its JSON log records
    carry the task's and the delivery's ids."""
    receiver.statuses = [500, 502]
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    worker = make_worker(
        "hooks",
        ANNIHILATION_HOOKS_OUTBOX_S="0.2",
        ANNIHILATION_HOOKS_RETRY_BASE_S="0.4",
        LOG_FORMAT="json",
        LOG_LEVEL="INFO",
        **{SECRET_ENV: SECRET},
    )
    publish("burst:events", "wave_completed", {"wave_id": 5})
    requests = receiver.wait(3, timeout=30)
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.8, gaps
    assert len({r.headers["X-Annihilation-Delivery"] for r in requests}) == 1
    assert len({r.body for r in requests}) == 1
    deadline = time.monotonic() + 10
    while WebhookDelivery.objects.get().status != "delivered" and time.monotonic() < deadline:
        time.sleep(0.05)
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.status_code, row.error) == ("delivered", 3, 200, "")
    assert deliveries_resend_due() == []  # the beat's sweep finds nothing to send again
    worker.stop()
    assert len(receiver.requests) == 3  # delivered once
    lines = [json.loads(line) for line in worker.log.read_text().splitlines()
             if line.startswith("{")]  # fmt: skip
    delivered = [
        r for r in lines if r["message"].startswith(f"webhook {row.delivery_id} delivered")
    ]
    assert delivered, worker.log.read_text()[-3000:]
    assert delivered[0]["delivery_id"] == str(row.delivery_id)
    assert delivered[0]["task_id"] and delivered[0]["level"] == "INFO"
    assert delivered[0]["logger"] == "hooks.services.outgoing"
    assert django_settings.HOOKS_OUTBOX_EVERY_S  # the beat entry exists in every process


@pytest.mark.django_db
def test_a_delivery_whose_task_was_lost_is_sent_again(receiver, signing, redis_client):
    """A worker killed mid-attempt leaves the delivery `sending`: once its deadline and the
    grace have passed, the sweep sends its task again and the next attempt may claim it."""
    signing.HOOKS_SWEEP_GRACE_S = 0
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    (pk,) = outbox_scan().created
    past = timezone.now() - timedelta(seconds=1)
    WebhookDelivery.objects.filter(pk=pk).update(status="sending", attempts=1, next_try_at=past)
    redis_client.delete("celery")
    assert deliveries_resend_due() == [pk]
    queued = [json.loads(m) for m in redis_client.lrange("celery", 0, -1)]
    assert [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in queued] == [
        ("hooks.deliver", f"({pk},)")
    ]
    assert delivery_attempt(delivery_id=pk).status == "delivered"
    assert WebhookDelivery.objects.get().attempts == 2


@pytest.mark.django_db
def test_a_delivery_being_sent_is_not_taken_twice(receiver, signing):
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    (pk,) = outbox_scan().created
    future = timezone.now() + timedelta(seconds=60)
    WebhookDelivery.objects.filter(pk=pk).update(status="sending", attempts=1, next_try_at=future)
    assert delivery_attempt(delivery_id=pk).status == "skipped"
    assert deliveries_resend_due() == []
    assert receiver.requests == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("answer", [200, 500])
def test_an_attempt_that_lost_the_delivery_meanwhile_records_nothing(receiver, signing, answer):
    """An attempt that outlives its deadline while the sweep gives the delivery to a later one:
    its answer is not written over the later attempt's, and it schedules no retry of its own."""
    endpoint(receiver.url, ["wave.completed"])
    start_outbox()
    publish("burst:events", "wave_completed", {"wave_id": 1})
    (pk,) = outbox_scan().created

    def taken_by_a_later_attempt(_: Any) -> None:
        WebhookDelivery.objects.filter(pk=pk).update(attempts=2)

    receiver.during = taken_by_a_later_attempt
    receiver.statuses = [answer]
    result = delivery_attempt(delivery_id=pk)
    assert (result.status, result.retry_in_s) == ("superseded", None)
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.status_code, row.delivered_at) == (
        "sending",
        2,
        None,
        None,
    )
