"""The psychonauts' tools of the Tether: ask_tether (suspends the run) and
propose_pipeline_change (does not: the proposal waits for the operator, the agent goes on).

Registered when the apps load (every process); the services they call are loaded by the first
call, in the worker that runs an agent.
"""

from __future__ import annotations

import json
from typing import Any

from core.redaction import redact, redact_data
from psychonauts.errors import SuspendRun, ToolFailure
from psychonauts.executors.permission import PERMISSION_TOOL
from psychonauts.runtime.tools import Tool, ToolContext
from tether.errors import TetherError
from tether.models import Priority, Reaching, ReachingStatus
from tether.services import answer_agrees, mutation_propose, reaching_ask, reaching_expire


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


# Claude Code's permission prompts (`--permission-prompt-tool`, served over MCP by
# psychonauts.executors.mcp): the Tether decides, never an automatic yes. The answer `yes` (or
# `allow`) allows that exact use for the rest of the run.
_PERMISSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string", "minLength": 1},
        "input": {"type": "object"},
        "tool_use_id": {"type": "string"},
    },
    "required": ["tool_name"],
}
DENIED = "denied: go on without it"


def permission_question(tool: str, given: dict[str, Any]) -> str:
    shown = json.dumps(redact_data(given), ensure_ascii=False, sort_keys=True)
    if len(shown) > 1500:
        shown = shown[:1500] + " ..."
    return f"The agent's CLI asks permission to use {tool} with {shown}. Allow it (yes/no)?"


def _permission(ctx: ToolContext, args: dict[str, Any]) -> str:
    """A permission prompt as a question to the Tether: suspends the run until it is answered;
    an earlier answer to the same question decides at once."""
    tool, given = str(args["tool_name"]), dict(args.get("input") or {})
    question = permission_question(tool, given)
    decided = (
        Reaching.objects.filter(
            agent_run_id=ctx.agent_run_id,
            question=redact(question),
            status__in=[ReachingStatus.ANSWERED, ReachingStatus.TIMED_OUT],
        )
        .order_by("-id")
        .first()
    )
    if decided is None:
        try:
            decided = reaching_ask(
                agent_run_id=ctx.agent_run_id, quantum_id=ctx.quantum_id,
                tool_use_id=ctx.tool_use_id, question=question, assumption=DENIED,
                priority="normal", timeout_s=None, context="a permission prompt of the CLI",
                turn_index=ctx.turn_index,
            )  # fmt: skip
        except TetherError as exc:
            raise ToolFailure(str(exc)) from None
        if ctx.depth > 0 and decided.status == ReachingStatus.PENDING:
            # A sub-agent cannot wait alone (as with ask_tether): denied at once, answerable late.
            reaching_expire(reaching_id=decided.pk, now=decided.deadline)
            decided.refresh_from_db()
        if decided.status == ReachingStatus.PENDING:
            raise SuspendRun(f"waiting on the Tether for a permission (reaching #{decided.pk})")
    if decided.status == ReachingStatus.ANSWERED and answer_agrees(decided.answer, "allow"):
        return json.dumps({"behavior": "allow", "updatedInput": given})
    why = f"the Tether answered: {decided.answer}" if decided.answer else "no answer in time"
    return json.dumps({"behavior": "deny", "message": f"not allowed ({why})"})


PERMISSION = Tool(
    PERMISSION_TOOL,
    "Asks the operator whether the agent's CLI may use a tool (Claude Code's permission prompt).",
    _PERMISSION_SCHEMA,
    _permission,
    changes_workspace=False,
)
