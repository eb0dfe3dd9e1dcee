"""The agent loop's hot statements in plain SQL: the run's read and claim, opening a turn, its
checkpoint, a tool's result, the run's end.

Every turn of every agent writes these rows, and a threads worker runs a hundred agents on one
core: Django compiles each ORM statement in more Python time than its round trip costs, and each
round trip hands the GIL around a hundred threads (docs/performance.md has the figures). So each
step is one statement, and the events buffered since the last step go in with it. Each statement
is written out whole here, with its parameters declared (`core.sql.Statement`), and this module
owns it. Besides
psychonauts' own rows of a turn (AgentTurn, Usage, ToolCall) they write, in the same round trip:
the run's row (bursts' AgentRun: its claim, phase, heartbeat and counters, its end: the same
compare-and-sets on its status that `bursts.services.agent_runs` makes), the run's session
(core's Session: the agent loop is its only writer) and the step's events (core's Event, as
`core.events.EventBatch` prepares them). The read builds model instances as Django does; the
tests read the rows back through the ORM, and other reads stay there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict, TypeVar

from django.db import connection, models

from bursts.models import AGENT_LIVE, AgentRun
from core import metrics
from core.events import EventBatch, EventParams
from core.models import Session
from core.sql import Statement
from psychonauts.models import AgentTurn, Role, ToolCall
from psychonauts.routing.providers.base import (
    ContentBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from quanta.models import Quantum

M = TypeVar("M", bound=models.Model)

# The run as an execution starts it, in one statement: all of it, of its quantum what the prompt
# uses, and its role (NULLs when no role has that name). Compiling this as an ORM query (a join,
# 33 columns) cost more worker CPU than any other statement of a run.
_RUN_COLUMNS = list(AgentRun._meta.concrete_fields)
_QUANTUM_COLUMNS = [
    Quantum._meta.get_field(name)
    for name in ("id", "title", "body", "kind", "labels", "acceptance", "verify_commands",
                 "complexity")
]  # fmt: skip
_ROLE_COLUMNS = list(Role._meta.concrete_fields)


def _select(alias: str, fields: Sequence[Any]) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in fields)


_RUN_READ = f"""
SELECT {_select("r", _RUN_COLUMNS)}, {_select("q", _QUANTUM_COLUMNS)}, {_select("o", _ROLE_COLUMNS)}
FROM {AgentRun._meta.db_table} r
JOIN {Quantum._meta.db_table} q ON q.id = r.quantum_id
LEFT JOIN {Role._meta.db_table} o ON o.name = r.role
WHERE r.id = %s
"""


def _instance(model: type[M], fields: Sequence[Any], values: Sequence[Any]) -> M:
    """A model instance from its columns, as the ORM builds one (the fields' converters, then
    `from_db`; fields not given are deferred)."""
    converted = []
    for field, value in zip(fields, values, strict=True):
        for convert in field.get_db_converters(connection):
            value = convert(value, field, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


def run_read(agent_run_id: int) -> tuple[AgentRun, Role | None] | None:
    """The run (its quantum loaded with what the prompt uses) and its role; None if no run."""
    with connection.cursor() as cursor:
        cursor.execute(_RUN_READ, [agent_run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    quantum_at = len(_RUN_COLUMNS)
    role_at = quantum_at + len(_QUANTUM_COLUMNS)
    run = _instance(AgentRun, _RUN_COLUMNS, row[:quantum_at])
    run.quantum = _instance(Quantum, _QUANTUM_COLUMNS, row[quantum_at:role_at])
    role = _instance(Role, _ROLE_COLUMNS, row[role_at:]) if row[role_at] is not None else None
    return run, role


class _Claim(TypedDict):
    id: int
    live: list[str]  # the statuses a claim takes a run from
    worker: str
    now: datetime
    provider: str | None  # None keeps the row's
    model: str | None
    session_ref: str
    session_title: str
    open_session: bool


# The session is found when an earlier execution opened it, else opened now (when
# `open_session`; a run refused before it starts gets none).
_RUN_CLAIM = Statement(
    "run_claim",
    "Live -> running for this execution, with the run's session; whether it was claimed.",
    _Claim,
    """
WITH run AS (
    UPDATE bursts_agentrun
    SET status = 'running', worker = %(worker)s, started_at = COALESCE(started_at, %(now)s),
        heartbeat_at = %(now)s, provider = COALESCE(%(provider)s, provider),
        model = COALESCE(%(model)s, model)
    WHERE id = %(id)s AND status = ANY(%(live)s)
    RETURNING id
), session_found AS (
    SELECT min(id) AS id FROM core_session WHERE kind = 'agent_run' AND ref = %(session_ref)s
), session_opened AS (
    INSERT INTO core_session (kind, ref, title, started_at)
    SELECT 'agent_run', %(session_ref)s, %(session_title)s, %(now)s
    WHERE %(open_session)s AND EXISTS (SELECT FROM run) AND (SELECT id FROM session_found) IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT FROM run),
       COALESCE((SELECT id FROM session_found), (SELECT id FROM session_opened))
""",
)

_LIVE = sorted(AGENT_LIVE)
assert Session.Kind.AGENT_RUN.value == "agent_run"  # as the statement spells it


def run_claim(
    *,
    agent_run_id: int,
    worker: str,
    now: datetime,
    route: tuple[str, str] | None,
    title: str,
) -> tuple[bool, int | None]:
    """Claim a run for this execution; returns whether it was claimed and its session's id.

    `route`: the provider and model it runs with, or None when it is refused (no session)."""
    claimed, session_id = _RUN_CLAIM.row(
        {
            "id": agent_run_id,
            "worker": worker,
            "now": now,
            "provider": route[0] if route else None,
            "model": route[1] if route else None,
            "session_ref": str(agent_run_id),
            "session_title": title,
            "open_session": route is not None,
            "live": _LIVE,
        }
    )
    return bool(claimed), session_id


class _Completion(TypedDict):
    """A turn's completion: its tool results, and its last call's result when that one's result
    has not been recorded on its own (NULL ids: nothing to complete)."""

    results: str  # JSON
    turn: int | None
    call: int | None
    output: str
    is_error: bool
    duration: int


@dataclass(frozen=True)
class TurnCompletion:
    """A turn whose tool calls have all run: its results, and its last call when that one's
    result has not been recorded on its own."""

    turn_id: int
    tool_results: list[ToolResultBlock]
    last_call: ToolCall | None

    def params(self) -> _Completion:
        call = self.last_call
        return {
            "results": json.dumps(self.tool_results),
            "turn": self.turn_id,
            "call": call.pk if call is not None else None,
            "output": call.output if call is not None else "",
            "is_error": call is not None and call.is_error,
            "duration": call.duration_ms if call is not None else 0,
        }


_NO_COMPLETION: _Completion = {
    "results": "[]",
    "turn": None,
    "call": None,
    "output": "",
    "is_error": False,
    "duration": 0,
}


class _TurnOpen(_Completion, EventParams):
    id: int
    phase: str
    now: datetime
    quantum_run: int | None  # the run's quantum run; None: a lone agent run
    agent_id: str
    attempt: int
    budgeted_wave: int | None  # its wave when that has a budget


# Opening a turn is one round trip: the last turn's completion (no-ops with NULL ids), the phase,
# heartbeat and events go in, and the spend the budgets need comes back: the quantum run's (or
# the lone agent run's, all its attempts') and the wave's when it has a budget. No run row when
# it is no longer running (cancelled meanwhile): then nothing is summed.
_TURN_OPEN = Statement(
    "turn_open",
    "A turn's opening: the last one's completion, phase, heartbeat, events; the spend so far.",
    _TurnOpen,
    """
WITH done_call AS (
    UPDATE psychonauts_toolcall
    SET output = %(output)s, is_error = %(is_error)s, completed = true, duration_ms = %(duration)s
    WHERE id = %(call)s
), done_turn AS (
    UPDATE psychonauts_agentturn SET tool_results = %(results)s::jsonb, complete = true
    WHERE id = %(turn)s
), run AS (
    UPDATE bursts_agentrun SET phase = %(phase)s, heartbeat_at = %(now)s
    WHERE id = %(id)s AND status = 'running'
    RETURNING id
), events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    RETURNING id
)
SELECT EXISTS (SELECT FROM run),
       CASE
           WHEN NOT EXISTS (SELECT FROM run) THEN NULL
           WHEN %(quantum_run)s::bigint IS NOT NULL THEN (
               SELECT COALESCE(SUM(cost_usd), 0) FROM psychonauts_usage
                WHERE quantum_run_id = %(quantum_run)s)
           ELSE (
               SELECT COALESCE(SUM(u.cost_usd), 0) FROM psychonauts_usage u
                 JOIN bursts_agentrun r ON r.id = u.agent_run_id
                WHERE r.agent_id = %(agent_id)s AND r.attempt = %(attempt)s)
       END,
       CASE
           WHEN %(budgeted_wave)s::bigint IS NULL OR NOT EXISTS (SELECT FROM run) THEN NULL
           ELSE (SELECT COALESCE(SUM(cost_usd), 0) FROM psychonauts_usage
                  WHERE wave_id = %(budgeted_wave)s)
       END,
       ARRAY(SELECT id FROM events ORDER BY id)
""",
)


def turn_open(
    *,
    agent_run_id: int,
    phase: str,
    now: datetime,
    quantum_run_id: int | None,
    agent_id: str,
    attempt: int,
    budgeted_wave_id: int | None,
    events: EventBatch,
    completion: TurnCompletion | None,
) -> tuple[Decimal, Decimal | None] | None:
    """Write the last turn's completion, the phase and the events; return what the quantum run
    (or the lone agent run) has spent, and the wave when it has a budget, or None when the run
    is no longer running."""
    running, spent, spent_wave, event_ids = _TURN_OPEN.row(
        {
            "phase": phase,
            "now": now,
            "id": agent_run_id,
            "quantum_run": quantum_run_id,
            "agent_id": agent_id,
            "attempt": attempt,
            "budgeted_wave": budgeted_wave_id,
            **events.params(),
            **(completion.params() if completion is not None else _NO_COMPLETION),
        }
    )
    events.sent(event_ids)
    return (spent, spent_wave) if running else None


class _Usage(TypedDict):
    """One model call's row in the ledger, and what it adds to its run's counters."""

    run: int
    quantum_run: int | None
    wave: int | None
    provider: str
    model: str
    tokens_in: int
    tokens_out: int
    cache_read: int
    cache_write: int
    cache_write_long: int
    cost: Decimal
    priced: bool
    phase: str
    now: datetime


class _TurnRecord(_Usage, EventParams):
    index: int
    assistant: str  # JSON
    calls: str  # JSON: [{id, name, input}]
    stop_reason: str
    complete: bool
    prompt: str


# Atomic on its own: the turn, its usage, its tool calls (pending), the run's counters and phase,
# and the events.
_TURN_RECORD = Statement(
    "turn_record",
    "A provider's answer: the turn, its usage, its pending tool calls, the run's counters.",
    _TurnRecord,
    """
WITH turn AS (
    INSERT INTO psychonauts_agentturn (agent_run_id, index, assistant, tool_results, stop_reason,
                                       complete, tokens_in, tokens_out, prompt, created_at)
    VALUES (%(run)s, %(index)s, %(assistant)s::jsonb, '[]'::jsonb, %(stop_reason)s, %(complete)s,
            %(tokens_in)s, %(tokens_out)s, %(prompt)s, %(now)s)
    RETURNING id
), usage AS (
    INSERT INTO psychonauts_usage (agent_run_id, quantum_run_id, wave_id, provider, model,
                                   tokens_in, tokens_out, cache_read_tokens, cache_write_tokens,
                                   cache_write_long_tokens, cost_usd, priced, created_at)
    VALUES (%(run)s, %(quantum_run)s, %(wave)s, %(provider)s, %(model)s, %(tokens_in)s,
            %(tokens_out)s, %(cache_read)s, %(cache_write)s, %(cache_write_long)s, %(cost)s,
            %(priced)s, %(now)s)
), calls AS (
    INSERT INTO psychonauts_toolcall (agent_run_id, turn_index, tool_use_id, name, input, output,
                                      is_error, completed, duration_ms, created_at)
    SELECT %(run)s, %(index)s, c.id, c.name, c.input, '', false, false, 0, %(now)s
    FROM jsonb_to_recordset(%(calls)s::jsonb) AS c(id text, name text, input jsonb)
    RETURNING id, tool_use_id
), counters AS (
    UPDATE bursts_agentrun
    SET tokens_in = tokens_in + %(tokens_in)s, tokens_out = tokens_out + %(tokens_out)s,
        cost_usd = cost_usd + %(cost)s, phase = %(phase)s, heartbeat_at = %(now)s
    WHERE id = %(run)s
), events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    RETURNING id
)
SELECT (SELECT id FROM turn), ARRAY(SELECT tool_use_id FROM calls), ARRAY(SELECT id FROM calls),
       ARRAY(SELECT id FROM events ORDER BY id)
""",
)

# A model call made outside our turn loop (an agent CLI's, through the model gateway): the same
# ledger row and counters as a turn's, the run keeping its phase.
_USAGE_RECORD = Statement(
    "usage_record",
    "A model call's usage in the ledger, and its tokens and cost added to its run's.",
    _Usage,
    """
WITH usage AS (
    INSERT INTO psychonauts_usage (agent_run_id, quantum_run_id, wave_id, provider, model,
                                   tokens_in, tokens_out, cache_read_tokens, cache_write_tokens,
                                   cache_write_long_tokens, cost_usd, priced, created_at)
    VALUES (%(run)s, %(quantum_run)s, %(wave)s, %(provider)s, %(model)s, %(tokens_in)s,
            %(tokens_out)s, %(cache_read)s, %(cache_write)s, %(cache_write_long)s, %(cost)s,
            %(priced)s, %(now)s)
), counters AS (
    UPDATE bursts_agentrun
    SET tokens_in = tokens_in + %(tokens_in)s, tokens_out = tokens_out + %(tokens_out)s,
        cost_usd = cost_usd + %(cost)s, phase = %(phase)s, heartbeat_at = %(now)s
    WHERE id = %(run)s
)
SELECT 1
""",
)


@dataclass(frozen=True)
class CallUsage:
    agent_run_id: int
    quantum_run_id: int | None
    wave_id: int | None
    provider: str
    model: str
    phase: str
    tokens_in: int  # read from no cache and written to none
    tokens_out: int
    cache_read: int
    cache_write: int
    cache_write_long: int
    cost_usd: Decimal | None  # None: the model's price is unknown
    now: datetime


def _usage_params(call: TurnRecord | CallUsage) -> _Usage:
    """A model call's ledger row and counters, as both statements take them."""
    return {
        "run": call.agent_run_id,
        "quantum_run": call.quantum_run_id,
        "wave": call.wave_id,
        "provider": call.provider,
        "model": call.model,
        "tokens_in": call.tokens_in,
        "tokens_out": call.tokens_out,
        "cache_read": call.cache_read,
        "cache_write": call.cache_write,
        "cache_write_long": call.cache_write_long,
        "cost": call.cost_usd or Decimal(0),
        "priced": call.cost_usd is not None,
        "phase": call.phase,
        "now": call.now,
    }


def usage_record(call: CallUsage) -> None:
    """One model call's usage in the ledger, and its tokens and cost added to its run's."""
    _USAGE_RECORD.run(_usage_params(call))


# A turn's completion on its own; or, with no turn, one tool call's result (no-ops with NULL ids).
_TURN_COMPLETE = Statement(
    "turn_complete",
    "A turn's completion with no next turn to carry it, or one tool call's result.",
    _Completion,
    """
WITH done_call AS (
    UPDATE psychonauts_toolcall
    SET output = %(output)s, is_error = %(is_error)s, completed = true, duration_ms = %(duration)s
    WHERE id = %(call)s
), done_turn AS (
    UPDATE psychonauts_agentturn SET tool_results = %(results)s::jsonb, complete = true
    WHERE id = %(turn)s
)
SELECT
""",
)


@dataclass(frozen=True)
class TurnRecord:
    agent_run_id: int
    quantum_run_id: int | None
    wave_id: int | None
    index: int
    assistant: list[ContentBlock]
    tool_uses: list[ToolUseBlock]
    stop_reason: str
    tokens_in: int
    tokens_out: int
    provider: str
    model: str
    cost_usd: Decimal | None  # None: the model's price is unknown
    phase: str
    now: datetime
    prompt: str = ""  # on the turn that opens the conversation: its first message
    cache_read: int = 0
    cache_write: int = 0
    cache_write_long: int = 0


def turn_record(record: TurnRecord, events: EventBatch) -> tuple[int, dict[str, int]]:
    """Write a provider's answer and the events; returns the turn's id and its tool calls' ids
    by tool_use id."""
    calls = [{"id": u["id"], "name": u["name"], "input": u["input"]} for u in record.tool_uses]
    turn_id, tool_use_ids, call_ids, event_ids = _TURN_RECORD.row(
        {
            **_usage_params(record),
            "index": record.index,
            "assistant": json.dumps(record.assistant),
            "calls": json.dumps(calls),
            "stop_reason": record.stop_reason,
            "complete": not record.tool_uses,
            "prompt": record.prompt,
            **events.params(),
        }
    )
    events.sent(event_ids)
    metrics.usage_recorded(
        provider=record.provider,
        model=record.model,
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        cost_usd=record.cost_usd or Decimal(0),
        cache_read=record.cache_read,
        cache_write=record.cache_write + record.cache_write_long,
    )
    return int(turn_id), dict(zip(tool_use_ids, call_ids, strict=True))


def tool_call_open(
    *, agent_run_id: int, turn_index: int, tool_use_id: str, name: str, input: dict[str, Any]
) -> ToolCall:
    """A tool call's row before it runs, for a call the turn's statement did not write."""
    return ToolCall.objects.create(
        agent_run_id=agent_run_id,
        turn_index=turn_index,
        tool_use_id=tool_use_id,
        name=name,
        input=input,
    )


def tool_call_answer(*, agent_run_id: int, tool_use_id: str, output: str, is_error: bool) -> bool:
    """The result of a call still pending (ask_tether's answer); False when there is none."""
    return (
        ToolCall.objects.filter(
            agent_run_id=agent_run_id, tool_use_id=tool_use_id, completed=False
        ).update(output=output, is_error=is_error, completed=True)
        == 1
    )


def tool_call_done(*, call_id: int, output: str, is_error: bool, duration_ms: int) -> None:
    """A tool call's result on its own (the completion's statement, with no turn)."""
    _TURN_COMPLETE.run(
        {
            **_NO_COMPLETION,
            "call": call_id,
            "output": output,
            "is_error": is_error,
            "duration": duration_ms,
        }
    )


def turn_feedback(*, turn_id: int, content: list[TextBlock]) -> None:
    """The runtime's answer to a final turn (a failed verification): stored as the turn's user
    reply, so the conversation a resumed run sends holds it, and the loop goes on."""
    AgentTurn.objects.filter(pk=turn_id).update(tool_results=content)


def turn_complete(completion: TurnCompletion) -> None:
    """Complete a turn in a statement of its own (no next turn opens to carry it)."""
    _TURN_COMPLETE.run(completion.params())


class _Finish(EventParams):
    id: int
    status: str
    phase: str
    result: str
    error: str
    now: datetime
    session_id: int


# The events go in only with the transition (the caller writes those that still belong
# otherwise).
_RUN_FINISH = Statement(
    "run_finish",
    "Running -> done | error with its outcome, its session's end and the events.",
    _Finish,
    """
WITH run AS (
    UPDATE bursts_agentrun
    SET status = %(status)s, phase = %(phase)s, result = %(result)s, error = %(error)s,
        finished_at = %(now)s, heartbeat_at = %(now)s
    WHERE id = %(id)s AND status = 'running'
    RETURNING id
), session_ended AS (
    UPDATE core_session SET ended_at = %(now)s
    WHERE id = %(session_id)s AND EXISTS (SELECT FROM run)
), events AS (
    INSERT INTO core_event (session_id, topic, type, payload, created_at)
    SELECT %(events_session)s, %(events_topic)s, e.type, e.payload, %(events_now)s
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(type text, payload jsonb)
    WHERE EXISTS (SELECT FROM run)
    RETURNING id
)
SELECT EXISTS (SELECT FROM run), ARRAY(SELECT id FROM events ORDER BY id)
""",
)


def run_finish(
    *,
    agent_run_id: int,
    status: str,
    phase: str,
    result: str,
    error: str,
    now: datetime,
    session_id: int,
    events: EventBatch,
) -> bool:
    """End a running run; False (nothing written) when it was no longer running."""
    finished, event_ids = _RUN_FINISH.row(
        {
            "id": agent_run_id,
            "status": status,
            "phase": phase,
            "result": result,
            "error": error,
            "now": now,
            "session_id": session_id,
            **events.params(),
        }
    )
    events.sent(event_ids)
    return bool(finished)


def turn_open_waiting(*, agent_run_id: int, tool_use: dict[str, Any]) -> None:
    """An agent CLI's call its run waits on (a question to the Tether), kept as an open turn:
    what wakes and resumes a waiting agent looks for one."""
    index = AgentTurn.objects.filter(agent_run_id=agent_run_id).count()
    AgentTurn.objects.create(
        agent_run_id=agent_run_id,
        index=index,
        assistant=[tool_use],
        stop_reason="tool_use",
        complete=False,
    )


def turn_answered(*, turn_id: int, tool_results: list[dict[str, Any]]) -> None:
    """An open turn's calls answered: the turn is complete with their results."""
    AgentTurn.objects.filter(pk=turn_id).update(tool_results=tool_results, complete=True)
