"""The only writer of Goal and GoalTransition: a goal's creation, its approval and abandonment,
every status change, and the few fields its planning and progress stamp on it.

Every status change is a compare-and-set on the goal's row (`UPDATE ... WHERE status IN <the
statuses GOAL_TRANSITIONS allows it from>`), a GoalTransition row with its reason and who made
it, and an event on `autopilot:goals`, in one transaction.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.utils import timezone

from autopilot.errors import GoalNotFound, IllegalGoalTransition, InvalidGoal
from autopilot.events import GoalEventType
from autopilot.events import goal_event as goal_event_publish
from autopilot.models import GOAL_TRANSITIONS, Goal, GoalSource, GoalStatus, GoalTransition
from autopilot.plan import labels_problems, verify_commands_problems
from core.safetext import text_problem
from quanta.errors import IllegalTransition, InvalidQuantum
from quanta.fields import clean_labels
from quanta.models import PRIORITY_MAX, PRIORITY_MIN, Quantum
from quanta.services import OPERATOR_CLOSABLE, quanta_close, quantum_close
from repos.context import current
from repos.models import Repository
from repos.services import default_repository_id

logger = logging.getLogger(__name__)

S = GoalStatus

ABANDONED_REASON = "goal abandoned"
TITLE_MAX = Goal._meta.get_field("title").max_length or 500
BY_MAX = GoalTransition._meta.get_field("by").max_length or 200
# The labels the autopilot sets: a goal may not carry them itself (they decide what its spend
# counts under and which goal its quanta belong to).
RESERVED_GOAL_LABELS = ("autopilot", "goal:")
BUDGET_MAX = Decimal("99999999.9999")


# --- transitions ------------------------------------------------------------------------------


def goal_event(event_type: GoalEventType, goal: Goal, **extra: Any) -> None:
    goal_event_publish(
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
def goal_transition(
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
    goal_event("goal_status_changed", goal, from_status=current, reason=reason, by=by)
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
    goal_event("goal_created", goal, source=source, by=goal.created_by)
    return goal


@transaction.atomic
def goal_approve(*, goal_id: int, by: str) -> Goal:
    """proposed | failed -> approved: the next decomposition pass plans it (a failed goal anew,
    with a fresh count of tries)."""
    by = _by(by)
    if not by:
        raise InvalidGoal("say who approves the goal", field="by")
    return goal_transition(
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
    goal = goal_transition(
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
        epic_close(goal.epic_id, ABANDONED_REASON)
    return goal


def epic_close(epic_id: int, reason: str) -> None:
    # Already closed (or an operator is running it by hand): leave it.
    with contextlib.suppress(IllegalTransition):
        quantum_close(quantum_id=epic_id, reason=reason)


# --- what planning and progress stamp on a goal -----------------------------------------------


def goal_epic_set(*, goal_id: int, epic_id: int) -> None:
    """The goal's epic, filed for it."""
    Goal.objects.filter(pk=goal_id).update(epic_id=epic_id, updated_at=timezone.now())


def goal_plan_refused(*, goal_id: int, tries: int, reason: str) -> None:
    """A refused plan: the tries so far and the problems, as the goal's reason."""
    Goal.objects.filter(pk=goal_id).update(
        plan_tries=tries, reason=reason, updated_at=timezone.now()
    )


def goal_stamp(*, goal_id: int, status: str) -> bool:
    """Stamp a goal still in `status` (compare-and-set): something was sent again for it, once
    per period rather than on every tick. False when it moved on."""
    return Goal.objects.filter(pk=goal_id, status=status).update(updated_at=timezone.now()) == 1
