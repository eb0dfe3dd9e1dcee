"""A goal's decomposition: its epic filed, a planner agent started on it, the plan the planner
hands over filed as the epic's children (or refused and tried again, up to
settings.AUTOPILOT_PLAN_TRIES, then the goal fails with the problems)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import chain, signature
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autopilot.labels import filed_labels, goal_label
from autopilot.models import Goal, GoalTransition
from autopilot.models import GoalStatus as S
from autopilot.plan import PLAN_FORMAT, Plan, planner_plan_read
from autopilot.services.goals.lifecycle import (
    TITLE_MAX,
    goal_epic_set,
    goal_event,
    goal_plan_refused,
    goal_stamp,
    goal_transition,
)
from bursts.canvas import agent_signature
from bursts.models import AGENT_TERMINAL, AgentRun
from core.celery import app
from psychonauts.runtime.runs import agent_run_create
from quanta.errors import QuantaError
from quanta.models import Complexity, Quantum, QuantumKind, QuantumStatus
from quanta.services import quantum_create, quantum_defer, quantum_reopen

logger = logging.getLogger(__name__)

PLANNER_ROLE = "goal-planner"
PROBLEMS_SHOWN = 20  # of a refused plan, in the next attempt's context and the goal's reason


def planner_agent_id(epic_id: int) -> str:
    """The agent id of a goal's planner runs (one attempt per try)."""
    return f"{epic_id}_goal_plan"


def _epic_body(goal: Goal) -> str:
    parts = [goal.description] if goal.description else []
    parts.append("## Success criteria\n" + goal.success_criteria)
    if goal.verify_commands:
        parts.append(
            "## The goal's verify commands (run on the integration branch once every quantum "
            "is merged)\n" + "\n".join(f"- `{c}`" for c in goal.verify_commands)
        )
    return "\n\n".join(parts)


def _epic_ensure(goal: Goal) -> int:
    """The goal's epic, filed when it has none (or it was deleted); deferred again when an
    operator closed or reopened it (a closed epic's workspace is swept away, an open one would
    be taken by a wave)."""
    status = (
        Quantum.objects.filter(pk=goal.epic_id).values_list("status", flat=True).first()
        if goal.epic_id is not None
        else None
    )
    if goal.epic_id is not None and status is not None:
        if status == QuantumStatus.CLOSED:
            quantum_reopen(quantum_id=goal.epic_id, reason=f"goal #{goal.pk} is planned again")
            status = QuantumStatus.OPEN
        if status in (QuantumStatus.OPEN, QuantumStatus.BLOCKED):
            quantum_defer(quantum_id=goal.epic_id)
        return goal.epic_id
    epic = quantum_create(
        repository_id=goal.repository_id,
        title=f"Goal #{goal.pk}: {goal.title}"[:TITLE_MAX],
        body=_epic_body(goal),
        kind=QuantumKind.EPIC,
        priority=goal.priority,
        labels=filed_labels("executing", goal_label(goal.pk), *goal.labels),
        acceptance=goal.success_criteria,
        # The planner reads the goal and the code: the strongest model a route offers.
        complexity=Complexity.COMPLEX,
    )
    quantum_defer(quantum_id=epic.pk)  # never taken by a wave: only the planner runs on it
    goal_epic_set(goal_id=goal.pk, epic_id=epic.pk)
    goal.epic_id = epic.pk
    return epic.pk


def _planner_context(goal: Goal, *, problems: Sequence[str], tries: int) -> str:
    parts = [
        f"## Goal #{goal.pk}: {goal.title}",
        "Decompose this goal into quanta: small units of work an agent can do one at a time, "
        "each with acceptance criteria, in the order their dependencies give. Read the code "
        "to make each quantum concrete (files, functions, tests). Do not change any file.",
    ]
    if goal.description:
        parts.append("### Description\n" + goal.description)
    parts.append("### Success criteria\n" + goal.success_criteria)
    if goal.verify_commands:
        parts.append(
            "### The goal's verify commands (they must pass once every quantum is merged)\n"
            + "\n".join(f"- `{c}`" for c in goal.verify_commands)
        )
    if goal.labels:
        parts.append("Labels of the goal: " + ", ".join(goal.labels))
    before = list(
        Quantum.objects.filter(parent_id=goal.epic_id)
        .order_by("pk")
        .values_list("pk", "status", "title")[:50]
    )
    if before:
        # Approved again after a failure: the earlier plan's quanta stay; plan what is left.
        failure = (
            GoalTransition.objects.filter(goal_id=goal.pk, to_status=S.FAILED)
            .order_by("-created_at", "-pk")
            .values_list("reason", flat=True)
            .first()
        )
        parts.append(
            "### Quanta filed for this goal before (they stay; plan only what is still needed)\n"
            + "\n".join(f"- #{pk} [{status}] {title}" for pk, status, title in before)
            + (f"\n\nWhy the goal failed then:\n{failure}" if failure else "")
        )
    parts.append(PLAN_FORMAT)
    if problems:
        shown = list(problems[:PROBLEMS_SHOWN])
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        left = settings.AUTOPILOT_PLAN_TRIES - tries
        parts.append(
            f"## Your previous plan was refused (try {tries} of "
            f"{settings.AUTOPILOT_PLAN_TRIES}; {left} left)\nFix every one of these problems "
            "and submit the whole plan again:\n" + "\n".join(f"- {p}" for p in shown)
        )
    return "\n\n".join(parts)


def _planner_start(goal: Goal, *, epic_id: int, problems: Sequence[str], tries: int) -> AgentRun:
    """A new planner attempt on the epic, sent to Celery after commit; the goal's progress is
    chained after it (and the tick looks too, should the chain be lost)."""
    run = agent_run_create(
        quantum_id=epic_id,
        role=PLANNER_ROLE,
        agent_id=planner_agent_id(epic_id),
        context=_planner_context(goal, problems=problems, tries=tries),
    )
    _planner_send(goal.pk, run.pk)
    return run


def _planner_send(goal_id: int, run_id: int) -> None:
    """After commit: the planner run's execution, then the goal's progress (a chain)."""

    def send() -> None:
        chain(
            agent_signature(run_id),
            signature("autopilot.goal_progress", args=(goal_id,), app=app, immutable=True),
        ).apply_async()

    transaction.on_commit(send)


def planner_resend(goal_id: int, run_id: int) -> None:
    """A planner run still pending long after it was sent (its message lost with a broker or a
    worker): sent again, chained as before. Executing a run is idempotent, so a message that was
    only late costs a no-op. The goal is stamped: sent again once per period, not every tick."""
    with transaction.atomic():
        if goal_stamp(goal_id=goal_id, status=S.DECOMPOSING):
            logger.warning(
                "goal %s: planner run %s still pending; sent again",
                goal_id,
                run_id,
                extra={"goal_id": goal_id, "agent_run_id": run_id},
            )
            _planner_send(goal_id, run_id)


def goals_decompose_due(*, limit: int = 10) -> int:
    """Approved goals, most urgent first: each gets its epic (filed if missing) and a planner
    run, and moves to decomposing. Returns how many started."""
    started = 0
    ids = list(
        Goal.objects.filter(status=S.APPROVED)
        .order_by("priority", "created_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    for goal_id in ids:
        with transaction.atomic():
            # Skip a goal another pass holds: it is being started there.
            goal = (
                Goal.objects.select_for_update(skip_locked=True)
                .filter(pk=goal_id, status=S.APPROVED)
                .first()
            )
            if goal is None:
                continue
            epic_id = _epic_ensure(goal)
            goal = goal_transition(
                goal_id,
                to=S.DECOMPOSING,
                reason=f"planning: planner {planner_agent_id(epic_id)} on epic #{epic_id}",
                by="autopilot",
            )
            _planner_start(goal, epic_id=epic_id, problems=(), tries=0)
            started += 1
    return started


def _plan_file(goal: Goal, plan: Plan, *, epic_id: int) -> list[int]:
    """The plan's quanta as the epic's children, with their `blocks` dependencies; their ids in
    the plan's order. The goal's labels go along, but not a `script:` label (it forces the
    planner's script; the plan's own labels steer its quanta)."""
    inherited = [label for label in goal.labels if not label.startswith("script:")]
    ids: dict[str, int] = {}
    for item in plan.in_order():
        quantum = quantum_create(
            repository_id=goal.repository_id,
            title=item.title,
            body=(item.body + "\n\n" if item.body else "")
            + f"Part of goal #{goal.pk}: {goal.title}",
            kind=QuantumKind.TASK,
            priority=goal.priority if item.priority is None else item.priority,
            labels=filed_labels("executing", goal_label(goal.pk), *inherited, *item.labels),
            parent_id=epic_id,
            acceptance=item.acceptance,
            verify_commands=list(item.verify_commands),
            depends_on=[ids[key] for key in item.depends_on],
            complexity=item.complexity,  # None: the classifier decides
        )
        ids[item.key] = quantum.pk
    return [ids[item.key] for item in plan.quanta]


def _problems_text(problems: Sequence[str]) -> str:
    shown = list(problems[:PROBLEMS_SHOWN])
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    return "\n".join(f"- {p}" for p in shown)


def _latest_planner_run(epic_id: int) -> AgentRun | None:
    return (
        AgentRun.objects.filter(agent_id=planner_agent_id(epic_id))
        .order_by("-attempt")
        .only("pk", "agent_id", "attempt", "status", "result", "error")
        .first()
    )


@transaction.atomic
def plan_take(goal_id: int) -> bool:
    """A decomposing goal whose planner ended: file its plan (-> active), or try again with the
    problems, or fail. Under the goal's row lock: a second look (the chain and the tick at once)
    waits, then finds the goal moved on or a new attempt running."""
    goal = Goal.objects.select_for_update().filter(pk=goal_id, status=S.DECOMPOSING).first()
    if goal is None or goal.epic_id is None:
        return False
    run = _latest_planner_run(goal.epic_id)
    if run is None:
        # Cannot happen through goals_decompose_due (the run is made with the transition);
        # an operator's deletion: plan again.
        _planner_start(goal, epic_id=goal.epic_id, problems=(), tries=goal.plan_tries)
        return False
    if run.status not in AGENT_TERMINAL:
        return False
    reading = planner_plan_read(run, max_quanta=settings.AUTOPILOT_PLAN_MAX_QUANTA)
    ids: list[int] = []
    problems = list(reading.problems)
    if reading.plan is not None:
        try:
            with transaction.atomic():  # a plan filed in part is not filed
                ids = _plan_file(goal, reading.plan, epic_id=goal.epic_id)
        except QuantaError as exc:
            # What the plan's checks could not know (the epic deleted meanwhile, the command
            # guard's settings changed): a refused plan like any other.
            problems = [f"the plan could not be filed: {exc}"]
    if reading.plan is not None and ids:
        notes = f"\n\nThe planner's notes: {reading.plan.notes}" if reading.plan.notes else ""
        goal_transition(
            goal_id,
            to=S.ACTIVE,
            reason=(
                f"planned by {run.agent_id} (attempt {run.attempt}): {len(ids)} quanta "
                + ", ".join(f"#{i}" for i in ids)
                + notes
            ),
            by=run.agent_id,
        )
        return True
    tries = goal.plan_tries + 1
    text = f"plan try {tries} of {settings.AUTOPILOT_PLAN_TRIES} refused:\n" + _problems_text(
        problems
    )
    if tries >= settings.AUTOPILOT_PLAN_TRIES:
        goal_transition(
            goal_id,
            to=S.FAILED,
            reason=f"no valid plan after {tries} tries; the last one's problems:\n"
            + _problems_text(problems),
            by=run.agent_id,
            plan_tries=tries,
            finished_at=timezone.now(),
        )
        return True
    goal_plan_refused(goal_id=goal_id, tries=tries, reason=text)
    goal.plan_tries, goal.reason = tries, text
    new_run = _planner_start(goal, epic_id=goal.epic_id, problems=problems, tries=tries)
    goal_event(
        "goal_plan_refused",
        goal,
        tries=tries,
        problems=problems[:PROBLEMS_SHOWN],
        agent_run_id=run.pk,
        next_agent_run_id=new_run.pk,
    )
    return False
