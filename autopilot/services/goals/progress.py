"""Moving goals on: plans of ended planner runs read, active goals whose quanta are finished ->
verifying, verifying goals with a quantum reopened -> active, lost verifications sent again."""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autopilot.errors import IllegalGoalTransition
from autopilot.models import Goal
from autopilot.models import GoalStatus as S
from autopilot.services.goals.lifecycle import goal_stamp, goal_transition
from autopilot.services.goals.planning import plan_take, planner_agent_id, planner_resend
from bursts.models import AGENT_TERMINAL, AgentRun, AgentStatus
from core.celery import app
from core.sql import Statement
from quanta.models import QuantumStatus
from tether.models import ChangeStatus

# --- completion -------------------------------------------------------------------------------


class _Goals(TypedDict):
    goal: int | None  # only this goal; None: every goal


# The statuses of a quantum not closed, as the statements spell them (the status index serves
# `IN` of them; `<> 'closed'` it cannot).
assert {*QuantumStatus.values} - {QuantumStatus.CLOSED} == {
    "open",
    "in_progress",
    "blocked",
    "deferred",
}
assert {ChangeStatus.MERGED, ChangeStatus.CONFLICTED} == {"merged", "conflicted"}

# Active goals whose children are all finished, in two steps so that the usual case (a goal with
# a quantum still to do) costs nothing per goal: the goals with no live child (one pass over the
# live quanta by the status index, hashed: it grows with the work in flight, not with history),
# and only for those the reviews of their children (by the parent and review foreign keys).
# Finished: no child of the epic has a done run whose branch is not reviewed yet (a review due:
# whether it made a change is not known), and none has work that is not in the integration branch
# although it is closed: its latest change review is anything but merged (pending, queued,
# merging; rejected and failed reopen the child), except a conflicted change whose correction
# quantum is closed with its own change merged (or with none), since the correction carried the
# work in. A child without a review made no change.
_READY_TO_VERIFY = Statement(
    "goals_ready_to_verify",
    "Active goals whose quanta are all closed, reviewed and merged (or made no change).",
    _Goals,
    """
WITH quiet AS MATERIALIZED (
    SELECT g.id, g.epic_id, g.priority, g.created_at FROM autopilot_goal g
     WHERE g.status = 'active' AND g.epic_id IS NOT NULL
       AND (%(goal)s::bigint IS NULL OR g.id = %(goal)s)
       AND g.epic_id NOT IN (
           SELECT c.parent_id FROM quanta_quantum c
            WHERE c.status IN ('open', 'in_progress', 'blocked', 'deferred')
              AND c.parent_id IS NOT NULL
       )
)
SELECT g.id FROM quiet g
 WHERE EXISTS (SELECT 1 FROM quanta_quantum c WHERE c.parent_id = g.epic_id)
   AND NOT EXISTS (
       SELECT 1 FROM quanta_quantum c JOIN tether_reviewdue d ON d.quantum_id = c.id
        WHERE c.parent_id = g.epic_id
   )
   AND NOT EXISTS (
       SELECT 1 FROM quanta_quantum c
       CROSS JOIN LATERAL (
           SELECT r.status, r.correction_id FROM tether_changereview r WHERE r.quantum_id = c.id
            ORDER BY r.created_at DESC, r.id DESC LIMIT 1
       ) latest
       WHERE c.parent_id = g.epic_id AND latest.status <> 'merged'
         AND NOT (
             latest.status = 'conflicted'
             AND EXISTS (
                 SELECT 1 FROM quanta_quantum k
                  WHERE k.id = latest.correction_id AND k.status = 'closed'
                    AND COALESCE((
                        SELECT r.status FROM tether_changereview r WHERE r.quantum_id = k.id
                         ORDER BY r.created_at DESC, r.id DESC LIMIT 1
                    ), 'merged') = 'merged'
             )
         )
   )
 ORDER BY g.priority, g.created_at
""",
)

# Verifying goals (few) with a child reopened, run again (a review due) or a change sent back
# meanwhile: the negation of _READY_TO_VERIFY's test.
_BACK_TO_ACTIVE = Statement(
    "goals_back_to_active",
    "Verifying goals with a quantum reopened, run again or its change not merged.",
    _Goals,
    """
SELECT g.id FROM autopilot_goal g
 WHERE g.status = 'verifying' AND g.epic_id IS NOT NULL
   AND (%(goal)s::bigint IS NULL OR g.id = %(goal)s)
   AND (
       EXISTS (SELECT 1 FROM quanta_quantum c WHERE c.parent_id = g.epic_id AND c.status <> 'closed')
       OR EXISTS (
           SELECT 1 FROM quanta_quantum c JOIN tether_reviewdue d ON d.quantum_id = c.id
            WHERE c.parent_id = g.epic_id
       )
       OR EXISTS (
           SELECT 1 FROM quanta_quantum c
           CROSS JOIN LATERAL (
               SELECT r.status, r.correction_id FROM tether_changereview r
                WHERE r.quantum_id = c.id
                ORDER BY r.created_at DESC, r.id DESC LIMIT 1
           ) latest
           WHERE c.parent_id = g.epic_id AND latest.status <> 'merged'
             AND NOT (
                 latest.status = 'conflicted'
                 AND EXISTS (
                     SELECT 1 FROM quanta_quantum k
                      WHERE k.id = latest.correction_id AND k.status = 'closed'
                        AND COALESCE((
                            SELECT r.status FROM tether_changereview r WHERE r.quantum_id = k.id
                             ORDER BY r.created_at DESC, r.id DESC LIMIT 1
                        ), 'merged') = 'merged'
                 )
             )
       )
   )
""",
)


def _verify_kick(goal_id: int) -> None:
    transaction.on_commit(lambda: app.send_task("autopilot.goal_verify", args=(goal_id,)))


def _to_verifying(goal_id: int) -> bool:
    with transaction.atomic():
        try:
            goal_transition(
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
        goal_transition(
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
            if status in AGENT_TERMINAL and plan_take(goal_pk):
                moved += 1
            elif status == AgentStatus.PENDING and max(created_at, goal_at) < lost_before:
                planner_resend(goal_pk, run_id)
    for (ready,) in _READY_TO_VERIFY.rows({"goal": goal_id}):
        moved += _to_verifying(ready)
    for (back,) in _BACK_TO_ACTIVE.rows({"goal": goal_id}):
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
            if goal_stamp(goal_id=lost, status=S.VERIFYING):
                _verify_kick(lost)
    return moved
