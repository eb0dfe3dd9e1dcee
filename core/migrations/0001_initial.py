"""The core tables: sessions and the event stream, and the Access model that carries the
control room's permission.

A database whose tables were made under the app label `annihilation` keeps them: the tables,
the event trigger's function and the content types are renamed to the `core` app's names, so
no row is copied or lost. A new database gets the tables made from the models.
"""

from typing import Any

import django.contrib.postgres.indexes
import django.contrib.postgres.search
import django.db.models.deletion
import django.db.models.expressions
from django.db import migrations, models

LEGACY_TABLES = {"annihilation_session": "core_session", "annihilation_event": "core_event"}


def tables_create_or_adopt(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    existing = set(connection.introspection.table_names())
    if set(LEGACY_TABLES) <= existing:
        with connection.cursor() as cursor:
            for old, new in LEGACY_TABLES.items():
                cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")
                cursor.execute(f"ALTER SEQUENCE IF EXISTS {old}_id_seq RENAME TO {new}_id_seq")
            cursor.execute(
                "ALTER FUNCTION annihilation_event_append_only() RENAME TO core_event_append_only"
            )
            cursor.execute(
                "UPDATE django_content_type SET app_label = 'core' WHERE app_label = 'annihilation'"
            )
            cursor.execute("DELETE FROM django_migrations WHERE app = 'annihilation'")
        return
    for name in ("Session", "Event"):
        schema_editor.create_model(apps.get_model("core", name))


def tables_drop(apps: Any, schema_editor: Any) -> None:
    for name in ("Event", "Session"):
        schema_editor.delete_model(apps.get_model("core", name))


class Migration(migrations.Migration):
    initial = True

    dependencies = [("contenttypes", "0002_remove_content_type_name")]

    state_operations = [
        migrations.CreateModel(
            name="Session",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("wave", "wave"),
                            ("burst", "burst"),
                            ("agent_run", "agent run"),
                            ("reflection", "reflection"),
                            ("operator", "operator"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "ref",
                    models.CharField(help_text="id of what the session follows", max_length=200),
                ),
                ("title", models.CharField(blank=True, max_length=300)),
                ("started_at", models.DateTimeField(auto_now_add=True)),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "indexes": [models.Index(fields=["kind", "ref"], name="session_kind_ref")],
            },
        ),
        migrations.CreateModel(
            name="Event",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("topic", models.CharField(max_length=200)),
                ("type", models.CharField(max_length=64)),
                ("payload", models.JSONField(default=dict)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "search",
                    models.GeneratedField(
                        db_persist=True,
                        expression=django.db.models.expressions.RawSQL(
                            "jsonb_to_tsvector('english'::regconfig, payload, '[\"string\"]')", []
                        ),
                        output_field=django.contrib.postgres.search.SearchVectorField(),
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="core.session",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["topic", "id"], name="event_topic_seq"),
                    models.Index(fields=["session", "id"], name="event_session_seq"),
                    django.contrib.postgres.indexes.GinIndex(
                        fields=["search"], name="event_search"
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Access",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
            ],
            options={
                "permissions": [
                    ("operate", "Can act in the control room (waves, answers, approvals)")
                ],
                "managed": False,
                "default_permissions": (),
            },
        ),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=state_operations),
        migrations.RunPython(tables_create_or_adopt, tables_drop),
    ]
