"""The webhook events' names: stored subscriptions and deliveries move to the past-tense names
with the migration, and the stream's own names come from the apps that publish them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from bursts.events import TOPIC, BurstEventType
from core.events import publish
from hooks.events import hook_event_for
from hooks.models import HookEvent
from hooks.services.outgoing import outbox_scan

BEFORE = [("hooks", "0001_initial")]
AFTER = [("hooks", "0002_event_names_past_tense")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_each_subscription_under_its_new_name() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    endpoint = old.get_model("hooks", "WebhookEndpoint").objects.create(
        name="ops", url="https://ops.example/h", secret_env="OPS_KEY",
        events=["wave.complete", "reaching.created", "change.pending", "alert.firing"],
    )  # fmt: skip
    old.get_model("hooks", "WebhookDelivery").objects.create(
        endpoint=endpoint, event_id=1, event="wave.complete", delivery_id=uuid.uuid4(), body="{}"
    )

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    row = new.get_model("hooks", "WebhookEndpoint").objects.get(pk=endpoint.pk)
    assert row.events == ["wave.completed", "reaching.created", "change.submitted", "alert.fired"]
    assert set(row.events) <= set(HookEvent.values)
    delivery = new.get_model("hooks", "WebhookDelivery").objects.get()
    assert delivery.event == "wave.completed"
    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_the_wave_event_is_the_bursts_apps_name() -> None:
    assert hook_event_for(TOPIC, BurstEventType.WAVE_COMPLETED, {}) is HookEvent.WAVE_COMPLETED
    assert hook_event_for(TOPIC, BurstEventType.WAVE_CANCELLED, {}) is None


@pytest.mark.django_db
def test_an_event_written_under_its_earlier_name_is_still_delivered(settings: Any) -> None:
    from hooks.models import WebhookDelivery, WebhookEndpoint
    from hooks.services.endpoints import endpoint_save

    endpoint_save(
        endpoint=WebhookEndpoint(
            name="ops", url="https://ops.example/h", secret_env="OPS_KEY", events=["wave.completed"]
        )
    )
    outbox_scan()
    publish(TOPIC, "wave_complete", {"wave_id": 1})  # a row of the release before the rename
    assert len(outbox_scan().created) == 1
    assert WebhookDelivery.objects.get().event == "wave.completed"
