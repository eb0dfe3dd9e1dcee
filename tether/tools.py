"""The psychonauts' tools of the Tether: ask_tether (suspends the run) and
propose_pipeline_change (does not: the proposal waits for the operator, the agent goes on).

Registered when the apps load (every process); the services they call are loaded by the first
call, in the worker that runs an agent.
"""

from __future__ import annotations

from typing import Any

from psychonauts.errors import SuspendRun, ToolFailure
from psychonauts.tools import Tool, ToolContext
from tether.errors import TetherError
from tether.models import Priority, ReachingStatus


def _ask_tether(ctx: ToolContext, args: dict[str, Any]) -> str:
    from tether.services import reaching_ask, reaching_expire

    try:
        reaching = reaching_ask(
            agent_run_id=ctx.agent_run_id,
            quantum_id=ctx.quantum_id,
            tool_use_id=ctx.tool_use_id,
            question=args["question"],
            assumption=args["assumption"],
            priority=args.get("priority", Priority.NORMAL),
            timeout_s=args.get("timeout_s"),
            context=args.get("context", ""),
            turn_index=ctx.turn_index,
        )
    except TetherError as exc:
        raise ToolFailure(str(exc)) from None
    if ctx.depth > 0 and reaching.status == ReachingStatus.PENDING:
        # A sub-agent runs in a thread of its parent's task, which waits for its result: it
        # cannot be suspended alone. It goes on at once on its assumption (a drift the operator
        # reviews), and the question stays answerable as a late answer.
        reaching_expire(reaching_id=reaching.pk, now=reaching.deadline)
        reaching.refresh_from_db()
    if reaching.status == ReachingStatus.ANSWERED:  # re-executed after the answer was recorded
        return f"The Tether answered: {reaching.answer}"
    if reaching.status == ReachingStatus.TIMED_OUT:
        return (
            f"No answer from the Tether. Proceed on your stated assumption: {reaching.assumption}"
        )
    if reaching.status == ReachingStatus.CANCELLED:
        raise ToolFailure("the question was cancelled")
    # Checkpoint and give the worker back; the answer or the deadline resumes the run.
    raise SuspendRun(f"waiting on the Tether (reaching #{reaching.pk})")


def _propose_pipeline_change(ctx: ToolContext, args: dict[str, Any]) -> str:
    from tether.services import mutation_propose

    try:
        mutation = mutation_propose(
            pipeline=args["pipeline"],
            text=args["yaml"],
            rationale=args.get("rationale", ""),
            agent_run_id=ctx.agent_run_id,
            quantum_id=ctx.quantum_id,
            tool_use_id=ctx.tool_use_id,
        )
    except TetherError as exc:
        raise ToolFailure(str(exc)) from None
    return (
        f"proposal #{mutation.pk} awaits the Tether (pipeline {mutation.pipeline_name}, based on "
        f"version {mutation.base_version}); go on with the current pipeline meanwhile"
    )


_STR = {"type": "string", "minLength": 1}

ASK_TETHER = Tool(
    "ask_tether",
    "Ask the human operator (the Tether) a question. You wait without holding a worker until "
    "the answer comes, or until timeout_s passes: then you proceed on your stated assumption, "
    "which is recorded for the operator to review. A sub-agent (spawned) proceeds on its "
    "assumption at once.",
    {
        "type": "object",
        "properties": {
            "question": _STR,
            "assumption": {**_STR, "description": "what you will do if nobody answers in time"},
            "priority": {"type": "string", "enum": Priority.values},
            "timeout_s": {"type": "number", "minimum": 0.5},
            "context": {"type": "string", "description": "why you ask; what you know"},
        },
        "required": ["question", "assumption"],
        "additionalProperties": False,
    },
    _ask_tether,
    changes_workspace=False,
)

PROPOSE_PIPELINE_CHANGE = Tool(
    "propose_pipeline_change",
    "Propose a new definition (YAML, as in pipelines/*.yaml) for a pipeline. The operator "
    "approves or rejects it later; you go on with the current pipeline.",
    {
        "type": "object",
        "properties": {"pipeline": _STR, "yaml": _STR, "rationale": {"type": "string"}},
        "required": ["pipeline", "yaml", "rationale"],
        "additionalProperties": False,
    },
    _propose_pipeline_change,
    changes_workspace=False,
)
