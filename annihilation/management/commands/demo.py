"""`manage.py demo`: the main job.

Loads the demo backlog (replacing an earlier one), shows what is ready and what blocks the rest,
then runs a wave over it on a demo git repository with the scripted provider (on Claude when
ANTHROPIC_API_KEY is set), and prints what every agent did and changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from annihilation.cli import shorten, table
from annihilation.demo_worker import worker_for_command
from psychonauts.errors import WorkspaceError
from psychonauts.roles import roles_sync_defaults
from psychonauts.workspaces import branch_for, demo_repo_ensure, git
from quanta.errors import QuantaError
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.pipelines.services import pipelines_ensure_defaults
from quanta.selectors import quanta_blocked, quanta_ready, quantum_why_not_ready

DEMO_FILE = settings.BASE_DIR / "demo" / "quanta.yaml"
DEMO_LABEL = "demo"


class Command(BaseCommand):
    help = "Load the demo backlog and show the ready set and what blocks the rest."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--file", type=Path, default=DEMO_FILE, help="backlog to load")
        parser.add_argument("--no-wave", action="store_true", help="load and explain only")
        parser.add_argument("--timeout", type=float, default=600, help="seconds the wave may take")

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
        if options["no_wave"]:
            w("")
            w(
                "Try: .venv/bin/python manage.py quanta ready | quanta show ID | quanta search 'todo*'"
            )
            return
        self.run_wave(ids, timeout=options["timeout"])

    def run_wave(self, ids: list[int], *, timeout: float) -> None:
        w = self.stdout.write
        roles_sync_defaults()
        pipelines_ensure_defaults()
        repo = demo_repo_ensure(Path(settings.ANNIHILATION_REPO))
        env = {}
        provider = settings.PSYCHONAUTS_PROVIDER or "scripted (per role)"
        if settings.ANTHROPIC_API_KEY and not settings.PSYCHONAUTS_PROVIDER:
            env["ANNIHILATION_PROVIDER"] = provider = "anthropic"
        w("")
        w(f"Running a wave over the demo quanta: repository {repo}, provider {provider}")
        failed = ""
        with worker_for_command(env=env) as worker:
            w(f"Celery: {worker}")
            try:
                call_command(
                    "start_wave",
                    "--label",
                    DEMO_LABEL,
                    "--follow",
                    "--timeout",
                    str(timeout),
                    stdout=self.stdout,
                    stderr=self.stderr,
                )
            except CommandError as exc:
                failed = str(exc)
        w("")
        w("What each agent changed (commits on each quantum's branch):")
        for quantum in Quantum.objects.filter(pk__in=ids).order_by("id"):
            branch = branch_for(quantum.pk)
            try:
                log = git("log", "--format=  %h %s", "--stat=100", f"main..{branch}", cwd=repo)
            except WorkspaceError:
                continue
            w(f"#{quantum.pk} {quantum.title!r} [{quantum.status}] on {branch}:")
            w(log or "  (no commits)")
        w("")
        w(
            f"Inspect: git -C {repo} log --all --oneline --graph | manage.py waves list | manage.py waves show ID"
        )
        if failed:
            raise CommandError(f"the demo wave did not succeed: {failed}")
