"""Loops: an agent that repeats itself is stopped before its budget is gone.

Two signs, read from the run's own turns after each one (its tool calls and their results):

- the same tool call (name and input) answered with the same result PSYCHONAUTS_LOOP_REPEATS
  times (3): what it does changes nothing, so doing it again will not either. A call whose
  result changes (a flaky test that fails, then passes) is not a repeat;
- PSYCHONAUTS_LOOP_WINDOW turns in a row (8) whose every call was made before with the same
  result: no new call, no new answer, no progress.

A stopped agent ends in error with the reason, and what it repeated is recorded as a trauma of
its quantum (`CommandTrauma`, source `loop`, with the quantum): the prompt of the quantum's later
agents says what the earlier one repeated. A quantum's traumas are not the guard's command
patterns (those have no quantum): a command that looped, a test run say, may be the right one to
run once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from psychonauts.models import AgentTurn, CommandTrauma, TraumaSource

_SHOWN = 200  # characters of a call's input in a reason
# A shell result leads with its exit status and how long it took: the time is no new result.
_ELAPSED = re.compile(r"\A(exit -?[0-9]+ \()[0-9]+(?:\.[0-9]+)?s")


@dataclass(frozen=True)
class Loop:
    reason: str
    name: str  # the tool repeated
    shown: str  # the call as a reader sees it: a shell command, or the tool's input as JSON


_Call = tuple[str, str, str, bool]  # name, input (canonical JSON), result digest, is_error


def _calls(turn: AgentTurn) -> list[_Call]:
    results: dict[str, Any] = {
        str(r.get("tool_use_id")): r for r in turn.tool_results or [] if isinstance(r, dict)
    }
    calls: list[_Call] = []
    for block in turn.assistant or []:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        result = results.get(str(block.get("id")))
        if result is None:
            continue  # not answered yet
        answer = result.get("content")
        if isinstance(answer, str):
            answer = _ELAPSED.sub(r"\1", answer, count=1)
        content = json.dumps(answer, sort_keys=True)
        digest = hashlib.sha256(content.encode()).hexdigest()
        name = str(block.get("name", ""))
        args = json.dumps(block.get("input") or {}, sort_keys=True)
        calls.append((name, args, digest, bool(result.get("is_error"))))
    return calls


def _shown(call: _Call) -> str:
    name, args = call[0], call[1]
    command = json.loads(args).get("command") if name == "shell" else None
    return str(command) if isinstance(command, str) else args


def loop_find(turns: Sequence[AgentTurn]) -> Loop | None:
    """The loop these turns (one execution's, in order) are in, or None."""
    repeats = settings.PSYCHONAUTS_LOOP_REPEATS
    window = settings.PSYCHONAUTS_LOOP_WINDOW
    seen: Counter[_Call] = Counter()
    stale = 0  # turns in a row with nothing new
    for turn in turns:
        calls = _calls(turn)
        new = False
        for call in calls:
            new = new or call not in seen
            seen[call] += 1
        stale = 0 if new or not calls else stale + 1
    for call, count in seen.most_common(1):
        if count >= repeats:
            shown = _shown(call)
            return Loop(
                reason=f"loop: the same {call[0]} call ({shown[:_SHOWN]}) returned the same "
                f"result {count} times",
                name=call[0],
                shown=shown,
            )
    if stale >= window:
        last = _calls(turns[-1])[0]
        return Loop(
            reason=f"loop: no progress in {stale} turns: every call repeated one made before, "
            f"with the same result (last: {last[0]} {_shown(last)[:_SHOWN]})",
            name=last[0],
            shown=_shown(last),
        )
    return None


def loop_trauma_record(*, loop: Loop, quantum_id: int, agent_id: str) -> CommandTrauma:
    """What the agent repeated, as a trauma of its quantum (counted again if already there)."""
    from psychonauts.containment.traumas import trauma_record

    return trauma_record(
        pattern=re.escape(loop.shown), reason=loop.reason, source=TraumaSource.LOOP,
        agent_id=agent_id, quantum_id=quantum_id,
    )  # fmt: skip


def loop_section(quantum_id: int) -> str:
    """The prompt's word on what earlier agents of the quantum repeated ("" when nothing)."""
    traumas = list(
        CommandTrauma.objects.filter(
            quantum_id=quantum_id, source=TraumaSource.LOOP, active=True
        ).order_by("id")[:5]
    )
    if not traumas:
        return ""
    lines = [f"- {t.reason}" for t in traumas]
    return (
        "## Loops on this quantum\nAn earlier agent was stopped for repeating itself; do not "
        "repeat what did not work:\n" + "\n".join(lines)
    )
