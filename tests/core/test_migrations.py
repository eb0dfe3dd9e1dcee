"""The core app's first migration keeps the rows of a database whose core tables were made
under the app label `annihilation`."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from core.access import OPERATE, operator_ensure
from core.models import Event, Session


def make_legacy() -> None:
    """Turn the migrated test database back into one made under the old label."""
    with connection.cursor() as cursor:
        for table in ("session", "event"):
            cursor.execute(f"ALTER TABLE core_{table} RENAME TO annihilation_{table}")
            cursor.execute(
                f"ALTER SEQUENCE core_{table}_id_seq RENAME TO annihilation_{table}_id_seq"
            )
        cursor.execute(
            "ALTER FUNCTION core_event_append_only() RENAME TO annihilation_event_append_only"
        )
        cursor.execute(
            "UPDATE django_content_type SET app_label = 'annihilation' WHERE app_label = 'core'"
        )
        cursor.execute("DELETE FROM django_migrations WHERE app = 'core'")
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('annihilation', '0001_initial', now())"
        )
    ContentType.objects.clear_cache()


@pytest.mark.django_db(transaction=True)
def test_it_adopts_the_tables_rows_and_permissions_of_the_old_label() -> None:
    session = Session.objects.create(kind=Session.Kind.WAVE, ref="7")
    event = Event.objects.create(session=session, topic="quanta", type="quantum_created")
    operator_ensure(username="op", password="pw")
    make_legacy()

    call_command("migrate", "core", verbosity=0)

    ContentType.objects.clear_cache()
    assert Event.objects.get().pk == event.pk and Event.objects.get().session == session
    assert Event.objects.create(topic="quanta", type="next").pk > event.pk  # the sequence moved
    assert User.objects.get(username="op").has_perm(OPERATE)
    assert not ContentType.objects.filter(app_label="annihilation").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT app FROM django_migrations WHERE app IN ('annihilation', 'core')")
        assert {row[0] for row in cursor.fetchall()} == {"core"}
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(type="rewritten")
