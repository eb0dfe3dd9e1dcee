"""The autopilot's agent tools: `submit_plan` (the goal planner hands over its decomposition)
and `propose_goal` (contemplation proposes a goal, which waits for the operator's approval).

Registered with the agent runtime from AutopilotConfig.ready().
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from autopilot.errors import AutopilotError
from autopilot.models import Goal, GoalSource, GoalStatus
from autopilot.plan import SUBMIT_PLAN_TOOL, plan_check, plan_problems_message
from psychonauts.errors import ToolFailure
from psychonauts.runtime.tools import Tool, ToolContext
from repos.context import current
from repos.services import default_repository_id


def _submit_plan(ctx: ToolContext, args: dict[str, Any]) -> str:
    # Checked here as the goal's progress will check it, so that a refused plan goes back to the
    # model within its run (it fixes it and calls again); nothing is filed here: the goal files
    # the last accepted call's plan once the run has ended.
    plan, problems = plan_check(args, max_quanta=settings.AUTOPILOT_PLAN_MAX_QUANTA)
    if plan is None:
        raise ToolFailure(
            plan_problems_message(problems) + "\nFix every problem and call submit_plan again."
        )
    return (
        f"plan accepted: {len(plan.quanta)} quanta. It is filed when your run ends; end now with "
        "a one-line summary."
    )


def _propose_goal(ctx: ToolContext, args: dict[str, Any]) -> str:
    # The agent runs in its anchor quantum's repository: the goal is that repository's, and
    # the limit counts that repository's proposals.
    from autopilot.services.goals.lifecycle import goal_create

    repository_id = current().repository_id or default_repository_id()
    waiting = Goal.objects.filter(
        status=GoalStatus.PROPOSED, source=GoalSource.CONTEMPLATION, repository_id=repository_id
    ).count()
    if waiting >= settings.AUTOPILOT_PROPOSALS_MAX:
        raise ToolFailure(
            f"{waiting} proposed goals already wait for the operator (at most "
            f"{settings.AUTOPILOT_PROPOSALS_MAX}); propose nothing more now"
        )
    try:
        goal = goal_create(
            title=args["title"],
            success_criteria=args["success_criteria"],
            description=args.get("description", ""),
            verify_commands=args.get("verify_commands", []),
            priority=args.get("priority", 2),
            labels=args.get("labels", []),
            source=GoalSource.CONTEMPLATION,
            by=ctx.agent_id,
            repository_id=repository_id,
        )
    except AutopilotError as exc:
        raise ToolFailure(str(exc)) from None
    return f"goal #{goal.pk} proposed; it waits for the operator's approval"


_STR = {"type": "string", "minLength": 1}

# Loose on purpose: plan_check reports every problem of a plan at once, named by where it is,
# where the schema would stop at its own first complaints.
SUBMIT_PLAN = Tool(
    SUBMIT_PLAN_TOOL,
    "Submit your decomposition of the goal: the quanta to file, each with a key, title, body, "
    "acceptance criteria, optional verify commands, labels, priority (0-4), complexity "
    "(trivial|standard|complex) and depends_on (keys of quanta of the plan that must be done "
    "first). Every problem is returned at once: fix them all and call again. The last accepted "
    "plan is filed when your run ends.",
    {
        "type": "object",
        "properties": {
            "quanta": {"type": "array", "items": {"type": "object"}},
            "notes": {"type": "string"},
        },
        "required": ["quanta"],
    },
    _submit_plan,
    changes_workspace=False,
)

PROPOSE_GOAL = Tool(
    "propose_goal",
    "Propose a goal for the project: it waits for the operator's approval (never approved "
    "automatically). Give a clear title, the success criteria (what must be true when it is "
    "done), and optionally a description, verify commands (shell commands that pass when it is "
    "done), a priority (0 critical .. 4 backlog) and labels.",
    {
        "type": "object",
        "properties": {
            "title": {**_STR, "maxLength": 500},
            "success_criteria": _STR,
            "description": {"type": "string"},
            "verify_commands": {"type": "array", "items": _STR, "maxItems": 50},
            "priority": {"type": "integer", "minimum": 0, "maximum": 4},
            "labels": {"type": "array", "items": _STR, "maxItems": 20},
        },
        "required": ["title", "success_criteria"],
        "additionalProperties": False,
    },
    _propose_goal,
    changes_workspace=False,
)
