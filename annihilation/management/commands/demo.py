"""`manage.py demo`: load the demo backlog (replacing an earlier one) and show what is ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from annihilation.cli import shorten, table
from quanta.errors import QuantaError
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.selectors import quanta_blocked, quanta_ready, quantum_why_not_ready

DEMO_FILE = settings.BASE_DIR / "demo" / "quanta.yaml"
DEMO_LABEL = "demo"


class Command(BaseCommand):
    help = "Load the demo backlog and show the ready set and what blocks the rest."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--file", type=Path, default=DEMO_FILE, help="backlog to load")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with transaction.atomic():
                # Safe to run twice: the previous demo backlog is replaced, nothing else touched.
                removed, _ = Quantum.objects.filter(labels__contains=[DEMO_LABEL]).delete()
                ids = quanta_import(path=options["file"])
        except QuantaError as exc:
            raise CommandError(str(exc)) from None
        w = self.stdout.write
        w(
            f"Loaded {len(ids)} demo quanta from {options['file'].name}"
            + (" (replacing the previous demo)" if removed else "")
        )
        w("")
        w("Ready now (a burst would take these, in this order):")
        ready = list(quanta_ready())
        table(
            self.stdout,
            ["ID", "P", "TITLE", "LABELS"],
            [(q.pk, q.priority, shorten(q.title, 50), ",".join(q.labels)) for q in ready],
        )
        w("")
        w("Blocked, and by what:")
        for quantum in quanta_blocked():
            w(quantum_why_not_ready(quantum_id=quantum.pk).describe())
        deferred = Quantum.objects.filter(pk__in=ids, status="deferred")
        for quantum in deferred:
            w(
                f"#{quantum.pk} {quantum.title!r} is deferred: `manage.py quanta reopen {quantum.pk}` makes it eligible."
            )
        w("")
        w("Try: .venv/bin/python manage.py quanta ready | quanta show ID | quanta search 'todo*'")
