"""`manage.py demo`: the main job.

Loads the demo backlog as a fresh set beside the earlier ones (their quanta, runs, reviews and
the playbook's evidence stay; what they left unfinished is deferred, and said so), shows what is
ready and what blocks the rest,
then runs a wave over it on a demo git repository with the scripted provider (on Claude when
ANTHROPIC_API_KEY is set), and prints what every agent did and changed. Then the learning loop:
what reflection learned from the wave's failures, and a second wave whose agents get it
(`annihilation.demo_learning`). Then an autopilot pass:
a goal is decomposed, executed, verified and merged, the hub improves the repository on its own
and comes to rest, each state change printed with its reason.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from annihilation.demo_autopilot import AUTOPILOT_ENV, autopilot_pass, demo_settings
from annihilation.demo_learning import (
    LEARNING_ENV,
    print_outcome,
    print_reflection,
    reopen_blocked,
)
from annihilation.demo_worker import ALREADY_RUNNING, worker_for_command
from bursts.models import QuantumRun, RunStatus, Wave
from core.access import operator_ensure
from core.cli import SafeCommand, seconds, shorten, table
from psychonauts.containment.sandbox import sandbox_status
from psychonauts.errors import WorkspaceError
from psychonauts.roles import roles_sync_defaults
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for, repo_local, repo_url
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.errors import QuantaError
from quanta.importer import quanta_import
from quanta.models import AuthorKind, Quantum
from quanta.pipelines.services import pipelines_ensure_defaults
from quanta.selectors import quanta_blocked, quanta_ready, quantum_why_not_ready
from quanta.services import comment_add, quantum_defer
from tether.errors import TetherError
from tether.models import ChangeStatus, DriftStatus, Reaching, ReachingStatus
from tether.selectors import changes_list, drifts_list
from tether.services import change_review_create, reaching_answer

DEMO_FILE = settings.BASE_DIR / "demo" / "quanta.yaml"
DEMO_LABEL = "demo"
# Quanta with this label ask the Tether (psychonauts/scripts/tether.yaml); the demo answers them.
ANSWERED_LABEL = "ask"
DEMO_ANSWER = "Keep the old API: other teams still call it."
# The control room's demo operator (loopback only; override the password with the env variable).
DEMO_OPERATOR = "operator"


# The demo repository's environment (a virtualenv and a test runner, built offline) and its
# real tests as the merge queue's check, unless the operator chose their own.
DEMO_ENVIRONMENT = Path(settings.BASE_DIR) / "demo" / "environment.yaml"
DEMO_VERIFY = "python -m run_tests"


def demo_environment_env() -> dict[str, str]:
    """The workers' variables that give the demo repository its environment and tests."""
    found: dict[str, str] = {}
    if not settings.ENV_DECLARATION:
        found["ANNIHILATION_ENV_DECLARATION"] = str(DEMO_ENVIRONMENT)
    if not settings.TETHER_VERIFY_COMMANDS:
        found["ANNIHILATION_TETHER_VERIFY_COMMANDS"] = DEMO_VERIFY
    return found


# The import keys of a demo set: `demo-<n>/<ref>`, one n per run of the demo.
DEMO_KEY = "demo-"


def _ids(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)


def demo_set_next() -> int:
    """The number of the demo set about to be loaded: one more than the highest loaded so far."""
    keys = Quantum.objects.filter(import_key__startswith=DEMO_KEY).values_list(
        "import_key", flat=True
    )
    numbers = [int(n) for k in keys if (n := k[len(DEMO_KEY) :].split("/", 1)[0]).isdigit()]
    return max(numbers, default=0) + 1


def demo_sets_set_aside(number: int) -> tuple[list[int], list[int]]:
    """Defer what the earlier demo sets left open or blocked, with a comment, so that the new
    set's wave runs the new set only (a question about a blocked one is withdrawn with it).
    Returns (deferred, still in progress)."""
    earlier = Quantum.objects.filter(labels__contains=[DEMO_LABEL]).order_by("pk")
    deferred = []
    for quantum_id in earlier.filter(status__in=["open", "blocked"]).values_list("pk", flat=True):
        quantum_defer(quantum_id=quantum_id)
        comment_add(
            quantum_id=quantum_id,
            body=f"Deferred: demo set {number} was loaded beside this one.",
            author="demo",
            author_kind=AuthorKind.SYSTEM,
        )
        deferred.append(quantum_id)
    return deferred, list(earlier.filter(status="in_progress").values_list("pk", flat=True))


class Command(SafeCommand):
    help = "Load the demo backlog and show the ready set and what blocks the rest."
    needs_redis = True

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--file", type=Path, default=DEMO_FILE, help="backlog to load")
        parser.add_argument("--no-wave", action="store_true", help="load and explain only")
        parser.add_argument(
            "--no-autopilot", action="store_true", help="skip the autopilot pass after the wave"
        )
        parser.add_argument(
            "--timeout", type=seconds, default=600, help="seconds the wave may take"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with transaction.atomic():
                # Safe to run twice: a fresh set beside the earlier ones, whose history stays.
                number = demo_set_next()
                set_aside, running = demo_sets_set_aside(number)
                ids = quanta_import(path=options["file"], key_prefix=f"{DEMO_KEY}{number}/")
        except QuantaError as exc:
            raise CommandError(str(exc)) from None
        w = self.stdout.write
        w(f"Loaded {len(ids)} demo quanta from {options['file'].name} (demo set {number})")
        if set_aside:
            w(
                f"Earlier demo sets keep their quanta, runs and reviews; their unfinished quanta "
                f"{_ids(set_aside)} are deferred (`manage.py quanta reopen ID` runs one again)."
            )
        if running:
            w(f"Still running from an earlier demo set, left as they are: {_ids(running)}.")
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
                "Try: .venv/bin/python manage.py quanta ready | quanta show ID | quanta search 'calc*'"
            )
        else:
            self.run_wave(ids, timeout=options["timeout"], autopilot=not options["no_autopilot"])
        self.print_login()

    def print_login(self) -> None:
        password = settings.DEMO_PASSWORD
        operator_ensure(username=DEMO_OPERATOR, password=password)
        w = self.stdout.write
        w("")
        w("The control room: run `make dev`, open http://127.0.0.1:8000/ and log in as")
        w(
            f"  user {DEMO_OPERATOR!r}, password {password!r} (an operator: may start waves, answer, ground)"
        )
        w(
            "  Django admin: http://127.0.0.1:8000/admin/ (`manage.py createsuperuser`); Flower: "
            "http://127.0.0.1:5555/ (user 'dev', password in .annihilation/flower-password, made by `make dev`)"
        )
        w(f"Agent sandbox: {sandbox_status().describe()}")

    def run_wave(self, ids: list[int], *, timeout: float, autopilot: bool) -> None:
        w = self.stdout.write
        roles_sync_defaults()
        pipelines_ensure_defaults()
        # A central repository (a URL) is used as it is; a local path gets the demo's own.
        repo = repo_local() if repo_url() else demo_repo_ensure(Path(settings.ANNIHILATION_REPO))
        env = {**LEARNING_ENV, **demo_environment_env(), **(AUTOPILOT_ENV if autopilot else {})}
        provider = settings.PSYCHONAUTS_PROVIDER or "scripted (per role)"
        if settings.ANTHROPIC_API_KEY and not settings.PSYCHONAUTS_PROVIDER:
            env["ANNIHILATION_PROVIDER"] = provider = "anthropic"
        w("")
        w(f"Running a wave over the demo quanta: repository {repo}, provider {provider}")
        answering = threading.Event()
        answerer = threading.Thread(target=self.answer_questions, args=(answering,), daemon=True)
        with worker_for_command(env=env) as worker:
            w(f"Celery: {worker}")
            answerer.start()
            try:
                first, failed = self.start_wave(timeout, failures_expected=True)
                self.print_changes(ids, repo)
                if not failed:
                    reflector = env.get("ANNIHILATION_PROVIDER") or settings.PSYCHONAUTS_PROVIDER
                    failed = self.learning_pass(
                        ids, first, timeout=timeout, reflector=reflector or "scripted"
                    )
            finally:
                answering.set()
                answerer.join(timeout=5)
            if autopilot and not failed:
                with demo_settings():
                    autopilot_pass(
                        self.stdout, timeout=timeout, own_worker=worker != ALREADY_RUNNING
                    )
        if failed:
            raise CommandError(f"the demo wave did not succeed: {failed}")

    def start_wave(self, timeout: float, *, failures_expected: bool = False) -> tuple[int, str]:
        """A wave over the demo label, followed to its end: (its id, why it failed or "").
        With `failures_expected`, a wave that ended with some runs failed did not fail."""
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
            failed = ""
        except CommandError as exc:
            failed = "" if failures_expected and exc.returncode == 1 else str(exc)
        return Wave.objects.order_by("-pk").values_list("pk", flat=True)[0], failed

    def learning_pass(self, ids: list[int], first: int, *, timeout: float, reflector: str) -> str:
        """What reflection learned from the first wave, then a second wave over the quanta it
        blocked (reopened, as the Tether would); why the second wave failed, or ""."""
        w = self.stdout.write
        rules = print_reflection(self.stdout, first, timeout=min(timeout, 60), provider=reflector)
        reopened = reopen_blocked(ids)
        if not reopened:
            w("No demo quantum is blocked: there is nothing for a second wave.")
            return ""
        w("")
        w(
            f"The demo reopens {', '.join(f'#{i}' for i in reopened)} (blocked after a failed "
            "review) and runs a second wave: their coders now get the playbook's rules."
        )
        second, failed = self.start_wave(timeout)
        print_outcome(self.stdout, first, second, rules)
        return failed

    def print_changes(self, ids: list[int], repo: Path) -> None:
        w = self.stdout.write
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
        # Each drained run's review is made by a Celery task; make sure the last ones exist
        # before printing (the service is idempotent per run: the task finds them done).
        for run_id in QuantumRun.objects.filter(
            quantum_id__in=ids, status=RunStatus.DONE
        ).values_list("pk", flat=True):
            change_review_create(quantum_run_id=run_id)
        self.print_grounding(ids)

    def answer_questions(self, stop: threading.Event) -> None:
        """The demo's Tether: answers the questions of quanta labelled `ask` as soon as they are
        pending (through the same service as `manage.py tether answer`); the others time out."""
        try:
            while not stop.wait(0.1):
                pending = Reaching.objects.filter(
                    status=ReachingStatus.PENDING,
                    quantum__labels__contains=[DEMO_LABEL, ANSWERED_LABEL],
                ).values_list("pk", "quantum_id", "question")
                for reaching_id, quantum_id, question in pending:
                    try:
                        reaching_answer(reaching_id=reaching_id, text=DEMO_ANSWER, by="demo")
                    except TetherError:
                        continue  # answered or timed out meanwhile
                    self.stdout.write(
                        f"  tether: the demo answered reaching {reaching_id} of #{quantum_id} "
                        f"({question!r}): {DEMO_ANSWER!r}"
                    )
        finally:
            connection.close()

    def print_grounding(self, ids: list[int]) -> None:
        """What waits for the operator: open drifts and pending changes, with the commands."""
        w = self.stdout.write
        w("")
        w("Open drifts (assumptions the agents went on with):")
        drifts = [d for d in drifts_list(status=DriftStatus.OPEN) if d.quantum_id in ids]
        table(
            self.stdout,
            ["ID", "QUANTUM", "ASSUMPTION", "QUESTION"],
            [
                (
                    d.pk,
                    f"#{d.quantum_id}",
                    shorten(d.assumption, 40),
                    shorten(d.reaching.question if d.reaching else "", 45),
                )
                for d in drifts
            ],
        )
        for d in drifts:
            w(
                f"  ground: manage.py tether ground {d.pk}   |   reject: manage.py tether reject "
                f"{d.pk} --reason 'TEXT'   |   note: manage.py tether note {d.pk} 'TEXT'"
            )
        w("")
        w("Pending changes (merge into the base branch after review):")
        changes = [c for c in changes_list(status=ChangeStatus.PENDING) if c.quantum_id in ids]
        table(
            self.stdout,
            ["ID", "QUANTUM", "RISK", "BRANCH", "FILES", "+", "-"],
            [
                (c.pk, f"#{c.quantum_id}", c.risk, c.branch, len(c.files), c.additions, c.deletions)
                for c in changes
            ],
        )
        if changes:
            w(
                "  show: manage.py tether show-change ID   |   approve: manage.py tether approve ID"
                "   |   reject: manage.py tether reject-change ID --reason 'TEXT'"
            )
            w(
                f"  e.g.  manage.py tether show-change {changes[0].pk} && manage.py tether approve {changes[0].pk}"
            )
