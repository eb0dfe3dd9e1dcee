"""A verifying goal's verify commands, run on the integration branch's tip -> done or failed."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from autopilot.errors import IllegalGoalTransition
from autopilot.models import Goal
from autopilot.models import GoalStatus as S
from autopilot.services.goals.lifecycle import epic_close, goal_transition
from autopilot.worktrees import scratch_at, scratch_remove, verify_lock
from psychonauts.containment.sandbox import workspace_own
from psychonauts.containment.verify import VerifyReport, verify_commands_run
from psychonauts.errors import WorkspaceError
from repos.context import working_on_id
from tether.services.changes import sha_of, target_branch

DONE_REASON = "goal done"


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
        return goal_transition(
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
        done = goal_transition(
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
        epic_close(done.epic_id, DONE_REASON)
    return done
