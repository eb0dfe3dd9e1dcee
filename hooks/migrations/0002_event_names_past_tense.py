"""The webhook events' names in the past tense: endpoints subscribed to the old names keep their
subscriptions, and recorded deliveries show the new names."""

from __future__ import annotations

import django.contrib.postgres.fields
from django.db import migrations, models

import hooks.models

RENAMED = {
    "wave.complete": "wave.completed",
    "change.pending": "change.submitted",
    "alert.firing": "alert.fired",
}
CHOICES = [
    ("wave.completed", "wave completed"),
    ("reaching.created", "reaching created"),
    ("change.submitted", "change submitted"),
    ("alert.fired", "alert fired"),
]


def _rename(apps, schema_editor, names):
    endpoint = apps.get_model("hooks", "WebhookEndpoint")
    delivery = apps.get_model("hooks", "WebhookDelivery")
    for row in endpoint.objects.all().only("events"):
        events = [names.get(e, e) for e in row.events]
        if events != row.events:
            endpoint.objects.filter(pk=row.pk).update(events=events)
    for old, new in names.items():
        delivery.objects.filter(event=old).update(event=new)


def forwards(apps, schema_editor):
    _rename(apps, schema_editor, RENAMED)


def backwards(apps, schema_editor):
    _rename(apps, schema_editor, {new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):
    dependencies = [("hooks", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="webhookendpoint",
            name="events",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(choices=CHOICES, max_length=32),
                help_text="any of: wave.completed, reaching.created, change.submitted, alert.fired",
                size=None,
                validators=[hooks.models.validate_events],
            ),
        ),
        migrations.AlterField(
            model_name="webhookdelivery",
            name="event",
            field=models.CharField(choices=CHOICES, max_length=32),
        ),
        migrations.RunPython(forwards, backwards),
    ]
