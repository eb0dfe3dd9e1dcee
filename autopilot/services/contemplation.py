"""Contemplating: a `contemplator` agent reads the project and proposes goals.

The agent runs on an anchor quantum (kind chore, status deferred so no wave ever runs it,
labels `autopilot`, `autopilot:contemplating`: its spend counts under contemplating), one anchor
reused while it stays open. Its context summarises the repository and the recent work, and
tells it how many goals it may propose: settings.AUTOPILOT_PROPOSALS_MAX minus the proposals
already waiting. It proposes through the `propose_goal` tool; what it proposes is a goal in
status `proposed` (source contemplation), which only the operator approves.

One contemplation at a time: starting one while a contemplator run is live does nothing, and
two starts at once are serialised by a transaction-level advisory lock.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from autopilot.events import contemplation_event
from autopilot.labels import filed_labels
from autopilot.models import Finding, Goal, GoalSource, GoalStatus, HubState
from bursts.models import AGENT_LIVE, AgentRun
from core.celery import app
from psychonauts.errors import WorkspaceError
from psychonauts.git import git
from psychonauts.services.runs import agent_run_create
from psychonauts.workspaces import repo_local
from quanta.models import Quantum, QuantumKind, QuantumStatus
from quanta.services import quantum_create, quantum_defer
from tether.services.changes import sha_of, target_branch

logger = logging.getLogger(__name__)

ROLE = "contemplator"
EXECUTE_TASK = "psychonauts.tasks.execute_agent_run"
ANCHOR_TITLE = "Contemplation: propose goals for the project"
# A constant advisory-lock key: contemplation starts one at a time.
_START_LOCK = 0x434F4E54  # "CONT"
RECENT = 10  # goals, findings and commits the context lists
FILES_LISTED = 60


def contemplation_labels() -> list[str]:
    return filed_labels(HubState.CONTEMPLATING)


def contemplation_running() -> AgentRun | None:
    """The live contemplator run, if any."""
    return (
        AgentRun.objects.filter(
            role=ROLE, status__in=AGENT_LIVE, quantum__labels__contains=contemplation_labels()
        )
        .order_by("-pk")
        .first()
    )


def proposals_waiting() -> int:
    """Goals contemplation proposed that wait for the operator."""
    return Goal.objects.filter(status=GoalStatus.PROPOSED, source=GoalSource.CONTEMPLATION).count()


def _anchor() -> Quantum:
    """The open anchor quantum, or a new one (created deferred, in the caller's transaction: no
    wave ever sees it open)."""
    found = (
        Quantum.objects.filter(labels__contains=contemplation_labels())
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


def contemplation_context(*, room: int) -> str:
    """What the contemplator starts from: the repository, the work, the goals, the findings,
    and how many goals it may propose."""
    counts = dict(
        Quantum.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n")
    )
    quanta = ", ".join(f"{status}: {counts.get(status, 0)}" for status in QuantumStatus.values)
    goals = list(
        Goal.objects.order_by("-created_at").values_list("pk", "title", "status", "source")[:RECENT]
    )
    goal_lines = "\n".join(
        f"- goal #{pk} [{status}, {source}] {title}" for pk, title, status, source in goals
    )
    findings = list(
        Finding.objects.filter(filed_at__isnull=False)
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


def contemplate_start() -> AgentRun | None:
    """Start a contemplator run on the anchor quantum, sent to a worker once committed. None
    when one is already live, or when AUTOPILOT_PROPOSALS_MAX proposals already wait."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_START_LOCK])
        if contemplation_running() is not None:
            return None
        room = settings.AUTOPILOT_PROPOSALS_MAX - proposals_waiting()
        if room <= 0:
            return None
        anchor = _anchor()
        run = agent_run_create(
            quantum_id=anchor.pk,
            role=ROLE,
            context=contemplation_context(room=room),
            agent_id=f"{anchor.pk}_autopilot_{ROLE}",
        )
        run_id = run.pk
        contemplation_event(
            "started",
            {
                "agent_run_id": run_id,
                "agent_id": run.agent_id,
                "quantum_id": anchor.pk,
                "room": room,
            },
        )
        transaction.on_commit(lambda: app.send_task(EXECUTE_TASK, args=(run_id,)))
    logger.info(
        "contemplation started: agent run %s on quantum #%s (%d proposals allowed)",
        run_id, anchor.pk, room, extra={"agent_run_id": run_id},
    )  # fmt: skip
    return run
