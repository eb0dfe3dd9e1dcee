"""Contemplating: a `contemplator` agent reads a repository and proposes goals for it.

Each registered repository is contemplated on its own. The agent runs on the repository's
anchor quantum (kind chore, status deferred so no wave ever runs it, labels `autopilot`,
`autopilot:contemplating`: its spend counts under contemplating), one anchor per repository
reused while it stays open. Its context summarises that repository and its recent work, and
tells it how many goals it may propose: settings.AUTOPILOT_PROPOSALS_MAX minus the proposals
already waiting in that repository. It proposes through the `propose_goal` tool; what it
proposes is a goal of that repository in status `proposed` (source contemplation), which only
the operator approves.

One contemplation at a time per repository: starting one while the repository's contemplator
run is live does nothing, and two starts at once are serialised by a transaction-level
advisory lock on the repository.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from autopilot.events import contemplation_event
from autopilot.labels import filed_labels
from autopilot.models import Finding, Goal, GoalSource, GoalStatus, HubState
from bursts.canvas import agent_signature
from bursts.models import AGENT_LIVE, AgentRun
from psychonauts.errors import WorkspaceError
from psychonauts.runtime.runs import agent_run_create
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import repo_local
from quanta.models import Quantum, QuantumKind, QuantumStatus
from quanta.services import quantum_create, quantum_defer
from repos.context import working_on_id
from repos.models import Repository
from repos.services import default_repository_id
from tether.services.changes import sha_of, target_branch

logger = logging.getLogger(__name__)

ROLE = "contemplator"
ANCHOR_TITLE = "Contemplation: propose goals for the project"
# An advisory-lock key, with the repository's id: contemplation starts one at a time per
# repository.
_START_LOCK = 0x434F4E54  # "CONT"
RECENT = 10  # goals, findings and commits the context lists
FILES_LISTED = 60


def contemplation_labels() -> list[str]:
    return filed_labels(HubState.CONTEMPLATING)


def contemplation_running(*, repository_id: int) -> AgentRun | None:
    """The live contemplator run of a repository, if any."""
    return (
        AgentRun.objects.filter(
            role=ROLE,
            status__in=AGENT_LIVE,
            quantum__labels__contains=contemplation_labels(),
            quantum__repository_id=repository_id,
        )
        .order_by("-pk")
        .first()
    )


def proposals_waiting(*, repository_id: int) -> int:
    """Goals contemplation proposed in a repository that wait for the operator."""
    return Goal.objects.filter(
        status=GoalStatus.PROPOSED, source=GoalSource.CONTEMPLATION, repository_id=repository_id
    ).count()


def _anchor(repository_id: int) -> Quantum:
    """The repository's open anchor quantum, or a new one (created deferred, in the caller's
    transaction: no wave ever sees it open)."""
    found = (
        Quantum.objects.filter(labels__contains=contemplation_labels(), repository_id=repository_id)
        .exclude(status=QuantumStatus.CLOSED)
        .order_by("pk")
        .first()
    )
    if found is not None:
        if found.status in (QuantumStatus.OPEN, QuantumStatus.BLOCKED):
            # Reopened by hand: deferred again, so no wave runs it.
            return quantum_defer(quantum_id=found.pk)
        return found
    quantum = quantum_create(
        title=ANCHOR_TITLE,
        body=(
            "The autopilot's contemplation runs on this quantum: a contemplator agent reads the "
            "project and proposes goals, which wait for the operator's approval. It is never run "
            "by a wave."
        ),
        kind=QuantumKind.CHORE,
        priority=4,
        labels=contemplation_labels(),
        repository_id=repository_id,
    )
    return quantum_defer(quantum_id=quantum.pk)


def _repository_summary() -> str:
    repo = repo_local()
    if not (repo / ".git").exists():
        return "No target repository is configured."
    try:
        branch = target_branch()
        tip = sha_of(branch) or branch  # a central repository's branch: fetched, by its sha
        files = git("ls-tree", "--name-only", "-r", "--full-tree", tip, cwd=repo).splitlines()
        log = git("log", "--oneline", "--no-decorate", f"-{RECENT}", tip, cwd=repo)
    except WorkspaceError as exc:
        return f"The target repository could not be read: {exc}"
    listed = "\n".join(f"- {name}" for name in files[:FILES_LISTED])
    more = f"\n- … and {len(files) - FILES_LISTED} more" if len(files) > FILES_LISTED else ""
    return (
        f"Integration branch `{branch}` ({len(files)} tracked files):\n{listed}{more}\n\n"
        f"Recent commits:\n{log or '(none)'}"
    )


def contemplation_context(*, room: int, repository_id: int | None = None) -> str:
    """What the contemplator starts from: the repository (None: the default one), its work,
    goals and findings, and how many goals it may propose."""
    if repository_id is None:
        repository_id = default_repository_id()
    with working_on_id(repository_id):
        return _context(room, repository_id)


def _context(room: int, repository_id: int) -> str:
    counts = dict(
        Quantum.objects.filter(repository_id=repository_id)
        .values_list("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )
    quanta = ", ".join(f"{status}: {counts.get(status, 0)}" for status in QuantumStatus.values)
    goals = list(
        Goal.objects.filter(repository_id=repository_id)
        .order_by("-created_at")
        .values_list("pk", "title", "status", "source")[:RECENT]
    )
    goal_lines = "\n".join(
        f"- goal #{pk} [{status}, {source}] {title}" for pk, title, status, source in goals
    )
    findings = list(
        Finding.objects.filter(filed_at__isnull=False, quantum__repository_id=repository_id)
        .order_by("-filed_at")
        .values_list("scanner", "path", "line", "message")[:RECENT]
    )
    finding_lines = "\n".join(
        f"- {scanner} {path}:{line} {message[:200]}" for scanner, path, line, message in findings
    )
    return "\n\n".join(
        [
            "## Repository\n" + _repository_summary(),
            f"## Quanta\n{quanta}",
            "## Recent goals (newest first; never propose one again)\n" + (goal_lines or "(none)"),
            "## Recent findings of the scanners\n" + (finding_lines or "(none)"),
            "## Your task\n"
            f"Propose at most {room} goal{'s' if room != 1 else ''} with `propose_goal`: each "
            "with a clear title, success criteria someone can check, and verify commands when a "
            "command can show it is done. Prefer goals that make the project better for its "
            "users over busywork; propose nothing when nothing is worth it. Your proposals wait "
            "for the operator's approval. End with a short summary of what you proposed and why.",
        ]
    )


def contemplations_start() -> dict[str, AgentRun | None]:
    """A contemplation in every registered repository (the default one made from
    ANNIHILATION_REPO when it has no row), by name: each repository's run, or None where one is
    live already or enough proposals wait there."""
    default_repository_id()
    started: dict[str, AgentRun | None] = {}
    for pk, name in (
        Repository.objects.filter(removed_at__isnull=True).order_by("pk").values_list("pk", "name")
    ):
        try:
            started[name] = contemplate_start(repository_id=pk)
        except Exception:  # one repository's failure leaves the others' contemplation
            logger.exception("contemplation of repository %s failed to start", name)
            started[name] = None
    return started


def contemplate_start(*, repository_id: int | None = None) -> AgentRun | None:
    """Start a contemplator run on a repository's anchor quantum (None: the default
    repository's), sent to a worker once committed. None when one is already live there, or
    when AUTOPILOT_PROPOSALS_MAX proposals already wait there."""
    if repository_id is None:
        repository_id = default_repository_id()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_START_LOCK, repository_id])
        if contemplation_running(repository_id=repository_id) is not None:
            return None
        room = settings.AUTOPILOT_PROPOSALS_MAX - proposals_waiting(repository_id=repository_id)
        if room <= 0:
            return None
        anchor = _anchor(repository_id)
        run = agent_run_create(
            quantum_id=anchor.pk,
            role=ROLE,
            context=contemplation_context(room=room, repository_id=repository_id),
            agent_id=f"{anchor.pk}_autopilot_{ROLE}",
        )
        run_id = run.pk
        contemplation_event(
            "started",
            {
                "agent_run_id": run_id,
                "agent_id": run.agent_id,
                "quantum_id": anchor.pk,
                "repository_id": repository_id,
                "room": room,
            },
        )
        transaction.on_commit(lambda: agent_signature(run_id).apply_async())
    logger.info(
        "contemplation started: agent run %s on quantum #%s (%d proposals allowed)",
        run_id, anchor.pk, room, extra={"agent_run_id": run_id},
    )  # fmt: skip
    return run
