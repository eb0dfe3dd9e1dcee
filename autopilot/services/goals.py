"""Goals: created, approved, decomposed by a planner agent into quanta, verified, done.

The only writer of Goal and GoalTransition. Every status change is a compare-and-set on the
goal's row (`UPDATE ... WHERE status IN <the statuses GOAL_TRANSITIONS allows it from>`), a
GoalTransition row with its reason and who made it, and an event on `autopilot:goals`, in one
transaction.

The way through:
- `goal_create` (proposed) and `goal_approve` (the operator; never automatic) -> approved;
- `goals_decompose_due` files the goal's epic (kind epic, deferred: no wave runs it) and starts a
  planner agent on it -> decomposing; the planner hands its plan over with `submit_plan` (or as
  its final answer);
- `goals_progress` (the planner's task chain, and the hub's tick as the safety net) reads the
  plan of a planner run that ended: a valid one files the quanta as the epic's children with
  their dependencies -> active; an invalid one goes back to a new planner attempt with the
  problems, up to settings.AUTOPILOT_PLAN_TRIES, then the goal fails with them;
- once every child is closed, its branch reviewed and its change merged (or it made none) ->
  verifying, and `goal_verify` runs the goal's verify commands on the integration branch's tip
  -> done, or failed with the failing commands. A child reopened meanwhile sends the goal back
  to active.

A goal that fails keeps its quanta (the operator reads them, reopens or closes them, approves
the goal again: it is planned anew, the new plan's quanta beside the old ones). Abandoning a goal
closes its quanta that are not running, and its epic.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from celery import chain, signature
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from autopilot.errors import GoalNotFound, IllegalGoalTransition, InvalidGoal
from autopilot.events import GoalEventType, goal_event
from autopilot.labels import filed_labels, goal_label
from autopilot.models import (
    GOAL_TRANSITIONS,
    Goal,
    GoalSource,
    GoalStatus,
    GoalTransition,
)
from autopilot.plan import (
    PLAN_FORMAT,
    Plan,
    labels_problems,
    planner_plan_read,
    verify_commands_problems,
)
from autopilot.worktrees import scratch_at, scratch_remove, verify_lock
from bursts.canvas import agent_signature
from bursts.models import AGENT_TERMINAL, AgentRun, AgentStatus
from core.celery import app
from core.safetext import text_problem
from psychonauts.containment.sandbox import workspace_own
from psychonauts.containment.verify import VerifyReport, verify_commands_run
from psychonauts.errors import WorkspaceError
from psychonauts.runtime.runs import agent_run_create
from quanta.errors import IllegalTransition, InvalidQuantum, QuantaError
from quanta.fields import clean_labels
from quanta.models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    Complexity,
    Quantum,
    QuantumKind,
    QuantumStatus,
)
from quanta.services import (
    OPERATOR_CLOSABLE,
    quanta_close,
    quantum_close,
    quantum_create,
    quantum_defer,
    quantum_reopen,
)
from repos.context import current, working_on_id
from repos.models import Repository
from repos.services import default_repository_id
from tether.models import ChangeReview, ChangeStatus, ReviewDue
from tether.services.changes import sha_of, target_branch

logger = logging.getLogger(__name__)

S = GoalStatus
PLANNER_ROLE = "goal-planner"
ABANDONED_REASON = "goal abandoned"
DONE_REASON = "goal done"
TITLE_MAX = Goal._meta.get_field("title").max_length or 500
BY_MAX = GoalTransition._meta.get_field("by").max_length or 200
# The labels the autopilot sets: a goal may not carry them itself (they decide what its spend
# counts under and which goal its quanta belong to).
RESERVED_GOAL_LABELS = ("autopilot", "goal:")
BUDGET_MAX = Decimal("99999999.9999")
PROBLEMS_SHOWN = 20  # of a refused plan, in the next attempt's context and the goal's reason


def planner_agent_id(epic_id: int) -> str:
    """The agent id of a goal's planner runs (one attempt per try)."""
    return f"{epic_id}_goal_plan"


# --- transitions ------------------------------------------------------------------------------


def _goal_event(event_type: GoalEventType, goal: Goal, **extra: Any) -> None:
    goal_event(
        event_type,
        {
            "goal_id": goal.pk,
            "title": goal.title,
            "status": goal.status,
            "priority": goal.priority,
            **extra,
        },
    )


def _allowed_from(to: str) -> frozenset[str]:
    return frozenset(s for s, targets in GOAL_TRANSITIONS.items() if to in targets)


@transaction.atomic
def _transition(
    goal_id: int,
    *,
    to: str,
    reason: str,
    by: str,
    allowed_from: frozenset[str] | None = None,
    **fields: Any,
) -> Goal:
    """Compare-and-set the goal's status (from a status GOAL_TRANSITIONS allows, narrowed by
    `allowed_from`), with its history row and event; IllegalGoalTransition names the status it
    is in."""
    allowed = _allowed_from(to) if allowed_from is None else allowed_from & _allowed_from(to)
    # Locked first: the history row records the status it really came from.
    current = (
        Goal.objects.select_for_update().filter(pk=goal_id).values_list("status", flat=True).first()
    )
    if current is None:
        raise GoalNotFound(f"no goal #{goal_id}")
    updated = 0
    if current in allowed:
        updated = Goal.objects.filter(pk=goal_id, status=current).update(
            status=to, reason=reason, updated_at=timezone.now(), **fields
        )
    if updated != 1:
        raise IllegalGoalTransition(
            f"cannot move goal #{goal_id} to {to}: it is {current}"
            f" (only from {', '.join(sorted(allowed)) or 'nothing'})"
        )
    GoalTransition.objects.create(
        goal_id=goal_id, from_status=current, to_status=to, reason=reason, by=by[:BY_MAX]
    )
    goal = Goal.objects.get(pk=goal_id)
    _goal_event("goal_status_changed", goal, from_status=current, reason=reason, by=by)
    logger.info(
        "goal %s: %s -> %s (%s)",
        goal_id,
        current,
        to,
        reason.splitlines()[0] if reason else "",
        extra={"goal_id": goal_id, "from_status": current, "to_status": to},
    )
    return goal


# --- creating, approving, abandoning ----------------------------------------------------------


def _text(field: str, value: Any, *, required: bool, limit: int | None = None) -> str:
    if not isinstance(value, str):
        raise InvalidGoal("must be text", field=field)
    text = value.strip()
    if required and not text:
        raise InvalidGoal("required, must not be empty", field=field)
    problem = text_problem(text)
    if problem is not None:
        raise InvalidGoal(problem, field=field)
    if limit is not None and len(text) > limit:
        raise InvalidGoal(f"at most {limit} characters (got {len(text)})", field=field)
    return text


def _priority(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidGoal(f"a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}", field="priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidGoal(
            f"from {PRIORITY_MIN} (critical) to {PRIORITY_MAX} (backlog), got {value}",
            field="priority",
        )
    return value


def _labels(value: Sequence[str]) -> list[str]:
    if isinstance(value, str):
        raise InvalidGoal("a list of labels", field="labels")
    problems = labels_problems("labels", list(value), reserved=False)
    if problems:
        raise InvalidGoal(problems[0])
    try:
        labels = clean_labels(list(value))
    except InvalidQuantum as exc:
        raise InvalidGoal(exc.problem, field=exc.field) from None
    for label in labels:
        if label.startswith(RESERVED_GOAL_LABELS):
            raise InvalidGoal(f"{label!r} is reserved for the autopilot", field="labels")
    return labels


def _budget(value: Any) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
        raise InvalidGoal("an amount in USD (e.g. 2.50), or none", field="budget_usd")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidGoal(f"{str(value)[:40]!r} is not an amount", field="budget_usd") from None
    if not amount.is_finite() or amount < 0:
        raise InvalidGoal("must be 0 or more", field="budget_usd")
    if amount > BUDGET_MAX:
        raise InvalidGoal(f"at most {BUDGET_MAX}", field="budget_usd")
    return amount.quantize(Decimal("0.0001"))


def _verify_commands(value: Sequence[str]) -> list[str]:
    if isinstance(value, str):
        raise InvalidGoal("a list of commands", field="verify_commands")
    commands = list(value)
    problems = verify_commands_problems("verify_commands", commands)
    if problems:
        raise InvalidGoal(problems[0])
    return [c.strip() for c in commands]


def _by(by: str) -> str:
    return _text("by", by, required=False, limit=BY_MAX)


@transaction.atomic
def goal_create(
    *,
    title: str,
    success_criteria: str,
    description: str = "",
    verify_commands: Sequence[str] = (),
    priority: int = 2,
    labels: Sequence[str] = (),
    budget_usd: Decimal | None = None,
    source: str = GoalSource.OPERATOR,
    by: str = "",
    repository_id: int | None = None,
) -> Goal:
    """A new goal, proposed (it waits for the operator's approval), in a repository (None: the
    one the caller works on, repos.context). InvalidGoal names the field; a verify command the
    command guard refuses is named with the guard's reason."""
    if source not in GoalSource.values:
        raise InvalidGoal(f"one of {', '.join(GoalSource.values)}", field="source")
    if (
        repository_id is not None
        and not Repository.objects.filter(pk=repository_id, removed_at__isnull=True).exists()
    ):
        raise InvalidGoal(f"no repository #{repository_id}", field="repository")
    goal = Goal.objects.create(
        repository_id=repository_id or current().repository_id or default_repository_id(),
        title=_text("title", title, required=True, limit=TITLE_MAX),
        success_criteria=_text("success_criteria", success_criteria, required=True),
        description=_text("description", description, required=False),
        verify_commands=_verify_commands(verify_commands),
        priority=_priority(priority),
        labels=_labels(labels),
        budget_usd=_budget(budget_usd),
        source=source,
        status=S.PROPOSED,
        reason=f"proposed by {by or source}",
        created_by=_by(by),
    )
    GoalTransition.objects.create(
        goal=goal, from_status="", to_status=S.PROPOSED, reason=goal.reason, by=goal.created_by
    )
    _goal_event("goal_created", goal, source=source, by=goal.created_by)
    return goal


@transaction.atomic
def goal_approve(*, goal_id: int, by: str) -> Goal:
    """proposed | failed -> approved: the next decomposition pass plans it (a failed goal anew,
    with a fresh count of tries)."""
    by = _by(by)
    if not by:
        raise InvalidGoal("say who approves the goal", field="by")
    return _transition(
        goal_id,
        to=S.APPROVED,
        reason=f"approved by {by}",
        by=by,
        approved_by=by,
        plan_tries=0,
        finished_at=None,
    )


@transaction.atomic
def goal_abandon(*, goal_id: int, by: str, reason: str = "") -> Goal:
    """Any open or failed goal -> abandoned. Its quanta that are not running are closed (reason
    "goal abandoned"), and its epic; a quantum being run finishes its run and stays for the
    operator. A planner still running is left to end; its plan is not filed."""
    by = _by(by)
    reason = _text("reason", reason, required=False)
    goal = _transition(
        goal_id,
        to=S.ABANDONED,
        reason=reason or f"abandoned by {by or 'the operator'}",
        by=by,
        finished_at=timezone.now(),
    )
    if goal.epic_id is not None:
        children = list(
            Quantum.objects.filter(parent_id=goal.epic_id, status__in=OPERATOR_CLOSABLE)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        quanta_close(reasons=dict.fromkeys(children, ABANDONED_REASON))
        _epic_close(goal.epic_id, ABANDONED_REASON)
    return goal


def _epic_close(epic_id: int, reason: str) -> None:
    # Already closed (or an operator is running it by hand): leave it.
    with contextlib.suppress(IllegalTransition):
        quantum_close(quantum_id=epic_id, reason=reason)


# --- decomposition ----------------------------------------------------------------------------


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
    Goal.objects.filter(pk=goal.pk).update(epic=epic, updated_at=timezone.now())
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


def _planner_resend(goal_id: int, run_id: int) -> None:
    """A planner run still pending long after it was sent (its message lost with a broker or a
    worker): sent again, chained as before. Executing a run is idempotent, so a message that was
    only late costs a no-op. The goal is stamped: sent again once per period, not every tick."""
    with transaction.atomic():
        if Goal.objects.filter(pk=goal_id, status=S.DECOMPOSING).update(updated_at=timezone.now()):
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
            goal = _transition(
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
def _plan_take(goal_id: int) -> bool:
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
        _transition(
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
        _transition(
            goal_id,
            to=S.FAILED,
            reason=f"no valid plan after {tries} tries; the last one's problems:\n"
            + _problems_text(problems),
            by=run.agent_id,
            plan_tries=tries,
            finished_at=timezone.now(),
        )
        return True
    Goal.objects.filter(pk=goal_id).update(plan_tries=tries, reason=text, updated_at=timezone.now())
    goal.plan_tries, goal.reason = tries, text
    new_run = _planner_start(goal, epic_id=goal.epic_id, problems=problems, tries=tries)
    _goal_event(
        "goal_plan_refused",
        goal,
        tries=tries,
        problems=problems[:PROBLEMS_SHOWN],
        agent_run_id=run.pk,
        next_agent_run_id=new_run.pk,
    )
    return False


# --- completion -------------------------------------------------------------------------------

_GOAL = Goal._meta.db_table
_QUANTUM = Quantum._meta.db_table
_REVIEW = ChangeReview._meta.db_table
_DUE = ReviewDue._meta.db_table

_LIVE = ", ".join(
    f"'{status}'" for status in QuantumStatus.values if status != QuantumStatus.CLOSED
)

# A child of the epic (`{epic}`) whose work is not in the integration branch although it is
# closed: its latest change review is anything but merged (pending, queued, merging; rejected and
# failed reopen the child), except a conflicted change whose correction quantum is closed with
# its own change merged (or with none): the correction carried the work in. A child without a
# review made no change, once no review of its runs is due (_REVIEW_DUE).
_CHANGE_UNMERGED = f"""
    EXISTS (
        SELECT 1 FROM {_QUANTUM} c
        CROSS JOIN LATERAL (
            SELECT r.status, r.correction_id FROM {_REVIEW} r WHERE r.quantum_id = c.id
             ORDER BY r.created_at DESC, r.id DESC LIMIT 1
        ) latest
        WHERE c.parent_id = {{epic}} AND latest.status <> '{ChangeStatus.MERGED}'
          AND NOT (
              latest.status = '{ChangeStatus.CONFLICTED}'
              AND EXISTS (
                  SELECT 1 FROM {_QUANTUM} k
                   WHERE k.id = latest.correction_id AND k.status = 'closed'
                     AND COALESCE((
                         SELECT r.status FROM {_REVIEW} r WHERE r.quantum_id = k.id
                          ORDER BY r.created_at DESC, r.id DESC LIMIT 1
                     ), '{ChangeStatus.MERGED}') = '{ChangeStatus.MERGED}'
              )
          )
    )
"""
# A child of the epic (`{epic}`) with a done run whose branch has not been reviewed yet: closed,
# but whether it made a change is not known.
_REVIEW_DUE = f"""
    EXISTS (
        SELECT 1 FROM {_QUANTUM} c JOIN {_DUE} d ON d.quantum_id = c.id WHERE c.parent_id = {{epic}}
    )
"""
# Active goals whose children are all finished, in two steps so that the usual case (a goal with
# a quantum still to do) costs nothing per goal: the goals with no live child (one pass over the
# live quanta by the status index, hashed: it grows with the work in flight, not with history),
# and only for those the reviews of their children (by the parent and review foreign keys).
_READY_TO_VERIFY = f"""
WITH quiet AS MATERIALIZED (
    SELECT g.id, g.epic_id, g.priority, g.created_at FROM {_GOAL} g
     WHERE g.status = 'active' AND g.epic_id IS NOT NULL {{only}}
       AND g.epic_id NOT IN (
           SELECT c.parent_id FROM {_QUANTUM} c
            WHERE c.status IN ({_LIVE}) AND c.parent_id IS NOT NULL
       )
)
SELECT g.id FROM quiet g
 WHERE EXISTS (SELECT 1 FROM {_QUANTUM} c WHERE c.parent_id = g.epic_id)
   AND NOT {_REVIEW_DUE.format(epic="g.epic_id")}
   AND NOT {_CHANGE_UNMERGED.format(epic="g.epic_id")}
 ORDER BY g.priority, g.created_at
"""
# Verifying goals (few) with a child reopened, run again or a change sent back, meanwhile.
_BACK_TO_ACTIVE = f"""
SELECT g.id FROM {_GOAL} g
 WHERE g.status = 'verifying' AND g.epic_id IS NOT NULL {{only}}
   AND (EXISTS (SELECT 1 FROM {_QUANTUM} c WHERE c.parent_id = g.epic_id AND c.status <> 'closed')
        OR {_REVIEW_DUE.format(epic="g.epic_id")}
        OR {_CHANGE_UNMERGED.format(epic="g.epic_id")})
"""


def _ids(sql: str, goal_id: int | None) -> list[int]:
    only = "AND g.id = %(goal)s" if goal_id is not None else ""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(only=only), {"goal": goal_id})
        return [row[0] for row in cursor.fetchall()]


def _verify_kick(goal_id: int) -> None:
    transaction.on_commit(lambda: app.send_task("autopilot.goal_verify", args=(goal_id,)))


def _to_verifying(goal_id: int) -> bool:
    with transaction.atomic():
        try:
            _transition(
                goal_id,
                to=S.VERIFYING,
                reason="every quantum is closed, reviewed and its change merged (or it made none)",
                by="autopilot",
                allowed_from=frozenset({S.ACTIVE}),
            )
        except IllegalGoalTransition:
            return False
        _verify_kick(goal_id)
    return True


def _to_active(goal_id: int) -> bool:
    try:
        _transition(
            goal_id,
            to=S.ACTIVE,
            reason="a quantum of the goal was reopened (or its change is not merged) while "
            "verifying",
            by="autopilot",
            allowed_from=frozenset({S.VERIFYING}),
        )
    except IllegalGoalTransition:
        return False
    return True


def _verify_stale_s() -> float:
    """How long a goal may stay verifying before its verification is sent again (a lost task, a
    worker that died): longer than the commands may take."""
    return float(settings.VERIFY_TIMEOUT_S) * 2 + 60


def goals_progress(*, goal_id: int | None = None) -> int:
    """Move goals on: plans of ended planner runs read (filed, retried or failed), active goals
    whose quanta are finished -> verifying (their verification sent), verifying goals with a
    quantum reopened -> active, and verifications lost for long sent again. `goal_id`: only that
    goal (the planner's chained task). Returns the goals that changed status.

    Cheap when nothing changed: each step selects its candidates by the goal status index
    first (decomposing and verifying goals are few; active ones are checked in one query)."""
    moved = 0
    decomposing = Goal.objects.filter(status=S.DECOMPOSING, epic__isnull=False)
    if goal_id is not None:
        decomposing = decomposing.filter(pk=goal_id)
    epics = {
        epic: (pk, at) for epic, pk, at in decomposing.values_list("epic_id", "pk", "updated_at")
    }
    if epics:
        latest = (
            AgentRun.objects.filter(agent_id__in=[planner_agent_id(e) for e in epics])
            .order_by("agent_id", "-attempt")
            .distinct("agent_id")
            .values_list("quantum_id", "status", "pk", "created_at")
        )
        lost_before = timezone.now() - timedelta(seconds=settings.AUTOPILOT_STUCK_S)
        for epic_id, status, run_id, created_at in latest:
            goal_pk, goal_at = epics[epic_id]
            if status in AGENT_TERMINAL and _plan_take(goal_pk):
                moved += 1
            elif status == AgentStatus.PENDING and max(created_at, goal_at) < lost_before:
                _planner_resend(goal_pk, run_id)
    for ready in _ids(_READY_TO_VERIFY, goal_id):
        moved += _to_verifying(ready)
    for back in _ids(_BACK_TO_ACTIVE, goal_id):
        moved += _to_active(back)
    stale = Goal.objects.filter(
        status=S.VERIFYING,
        updated_at__lt=timezone.now() - timedelta(seconds=_verify_stale_s()),
    )
    if goal_id is not None:
        stale = stale.filter(pk=goal_id)
    for lost in stale.values_list("pk", flat=True):
        with transaction.atomic():
            # Stamped: sent again once per period, not on every tick.
            if Goal.objects.filter(pk=lost, status=S.VERIFYING).update(updated_at=timezone.now()):
                _verify_kick(lost)
    return moved


# --- verification on the integration branch ---------------------------------------------------


def goal_verify(*, goal_id: int) -> Goal | None:
    """Run a verifying goal's verify commands on the integration branch's tip of its repository
    (a scratch worktree detached there, through the guard and the sandbox) -> done (its epic
    closed) or failed with what failed. None when the goal is not verifying, or another
    verification of it is running; a goal that moved on meanwhile (a quantum reopened) keeps its
    new status."""
    repository_id = Goal.objects.filter(pk=goal_id).values_list("repository_id", flat=True)
    with working_on_id(repository_id.first()):
        return _goal_verify(goal_id)


def _goal_verify(goal_id: int) -> Goal | None:
    with verify_lock(goal_id) as held:
        if not held:
            return None
        goal = Goal.objects.filter(pk=goal_id, status=S.VERIFYING).first()
        if goal is None or goal.epic_id is None:
            return None
        target = target_branch()
        sha = sha_of(target)
        if not goal.verify_commands:
            return _verified(goal, VerifyReport(checks=()), target=target, sha=sha)
        if not sha:
            return _verify_failed(goal, f"the integration branch {target!r} has no commit")
        try:
            where = scratch_at(goal_id, sha)
        except WorkspaceError as exc:
            return _verify_failed(goal, f"could not check out {target} at {sha[:10]}: {exc}")
        try:
            # Run as the epic's sandbox user, as its quanta's agents run.
            workspace_own(where, quantum_id=goal.epic_id)
            if not connection.in_atomic_block:
                connection.close()  # the commands may run for minutes: no idle connection
            report = verify_commands_run(
                list(goal.verify_commands), workspace=where, quantum_id=goal.epic_id
            )
        finally:
            scratch_remove(where)
        return _verified(goal, report, target=target, sha=sha)


def _verify_failed(goal: Goal, reason: str) -> Goal | None:
    try:
        return _transition(
            goal.pk,
            to=S.FAILED,
            reason=reason,
            by="autopilot",
            allowed_from=frozenset({S.VERIFYING}),
            finished_at=timezone.now(),
        )
    except IllegalGoalTransition:
        return None


@transaction.atomic
def _verified(goal: Goal, report: VerifyReport, *, target: str, sha: str) -> Goal | None:
    at = f"{target} at {sha[:10]}" if sha else target
    if not report.passed:
        return _verify_failed(
            goal,
            f"verify failed on {at}: {len(report.failed)} of {len(report.checks)} "
            "command(s) failed\n" + report.summary(),
        )
    try:
        done = _transition(
            goal.pk,
            to=S.DONE,
            reason=(
                f"verified on {at}: {len(report.checks)} command(s) passed"
                if report.checks
                else f"done: every quantum merged into {at} (the goal has no verify commands)"
            ),
            by="autopilot",
            allowed_from=frozenset({S.VERIFYING}),
            finished_at=timezone.now(),
        )
    except IllegalGoalTransition:
        return None
    if done.epic_id is not None:
        _epic_close(done.epic_id, DONE_REASON)
    return done
