"""The agent loop's hot statements in plain SQL: the run's read and claim, opening a turn, its
checkpoint, a tool's result, the run's end.

Every turn of every agent writes these rows, and a threads worker runs a hundred agents on one
core: Django compiles each ORM statement in ~0.3 ms of Python, more than its round trip costs,
and each round trip hands the GIL around a hundred threads. So each step is one statement, and
the events buffered since the last step go in with it (`EventBatch.cte`). This module writes
psychonauts' own rows of a turn (AgentTurn, Usage, ToolCall); the other tables' parts of a
statement are CTEs their writers provide: the run's claim, phase, counters and outcome
(`bursts.services.agent_runs`), its session (`core.sessions`), the events (`core.events`). The
statements write exactly the rows the models describe, with the tables' and columns' names taken
from the models, and the one read builds model instances as Django does; the tests read the rows
back through the ORM, and other reads stay there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import connection, models

from bursts.models import AGENT_LIVE, AgentRun
from bursts.services.agent_runs import (
    agent_run_claim_cte,
    agent_run_counters_cte,
    agent_run_finish_cte,
    agent_run_turn_open_cte,
)
from core import metrics
from core.events import EventBatch
from core.models import Session
from core.sessions import SESSION_ID, session_ended_cte, session_found_cte, session_opened_cte
from core.sql import sql_names
from psychonauts.models import AgentTurn, Role, ToolCall, Usage
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

# Names of the tables this module writes itself, for the statements below.
_T = sql_names(AgentTurn, "t_")
_U = sql_names(Usage, "u_")
_C = sql_names(ToolCall, "c_")
_A = sql_names(AgentRun, "a_")


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


# Claiming a run to execute it (pending | running | waiting -> running), guarded, with its
# session: found when an earlier execution opened it, else opened now (when `open_session`; a
# run refused before it starts gets none).
_OPEN_SESSION = "%(open_session)s AND EXISTS (SELECT FROM run)"
_RUN_CLAIM = f"""
WITH {agent_run_claim_cte()},
{session_found_cte(kind=Session.Kind.AGENT_RUN)},
{session_opened_cte(kind=Session.Kind.AGENT_RUN, only_if=_OPEN_SESSION)}
SELECT EXISTS (SELECT FROM run), {SESSION_ID}
"""

_LIVE = sorted(AGENT_LIVE)  # the statuses a claim takes a run from, as the statement's array


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
    with connection.cursor() as cursor:
        cursor.execute(
            _RUN_CLAIM,
            {
                "id": agent_run_id,
                "worker": worker,
                "now": now,
                "provider": route[0] if route else None,
                "model": route[1] if route else None,
                "session_ref": str(agent_run_id),
                "session_title": title,
                "session_now": now,
                "open_session": route is not None,
                "live": _LIVE,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # a SELECT of subqueries always has its row
    return bool(row[0]), row[1]


@dataclass(frozen=True)
class TurnCompletion:
    """A turn whose tool calls have all run: its results, and its last call when that one's
    result has not been recorded on its own."""

    turn_id: int
    tool_results: list[ToolResultBlock]
    last_call: ToolCall | None

    def params(self) -> dict[str, Any]:
        call = self.last_call
        return {
            "results": json.dumps(self.tool_results),
            "turn": self.turn_id,
            "call": call.pk if call is not None else None,
            "output": call.output if call is not None else "",
            "is_error": call is not None and call.is_error,
            "duration": call.duration_ms if call is not None else 0,
        }


# Completing a turn (no-ops with NULL ids): a statement of its own, or part of the next turn's.
_COMPLETION = """done_call AS (
    UPDATE {c_table}
    SET {c_output} = %(output)s, {c_is_error} = %(is_error)s, {c_completed} = true,
        {c_duration_ms} = %(duration)s
    WHERE {c_id} = %(call)s
), done_turn AS (
    UPDATE {t_table} SET {t_tool_results} = %(results)s::jsonb, {t_complete} = true
    WHERE {t_id} = %(turn)s
)""".format(**_C, **_T)
_NO_COMPLETION: dict[str, Any] = {
    "results": "[]",
    "turn": None,
    "call": None,
    "output": "",
    "is_error": False,
    "duration": 0,
}

# Opening a turn is one round trip: the last turn's completion, the phase, heartbeat and events
# go in, and the spend the budgets need comes back; no run row when it is no longer running
# (cancelled meanwhile).
_TURN_OPEN = """
WITH {completion}, {run}, {events}
SELECT EXISTS (SELECT FROM run), (SELECT spent FROM run), (SELECT spent_wave FROM run), {ids}
"""
_SPEND_RUN = (
    "(SELECT COALESCE(SUM({u_cost_usd}), 0) FROM {u_table} WHERE {u_quantum_run_id} = %(qr)s)"
).format(**_U)
_SPEND_ALONE = (
    "(SELECT COALESCE(SUM(u.{u_cost_usd}), 0) FROM {u_table} u"
    " JOIN {a_table} r ON r.{a_id} = u.{u_agent_run_id}"
    " WHERE r.{a_agent_id} = %(agent_id)s AND r.{a_attempt} = %(attempt)s)"
).format(**_U, **_A)
_SPEND_WAVE = (
    "(SELECT COALESCE(SUM({u_cost_usd}), 0) FROM {u_table} WHERE {u_wave_id} = %(wave)s)"
).format(**_U)
# The four statements, by (a quantum run's agent, a wave with a budget).
_TURN_OPENS = {
    (in_run, budgeted): _TURN_OPEN.format(
        completion=_COMPLETION,
        run=agent_run_turn_open_cte(
            returning=f"{_SPEND_RUN if in_run else _SPEND_ALONE} AS spent, "
            f"{_SPEND_WAVE if budgeted else 'NULL'} AS spent_wave"
        ),
        events=EventBatch.cte(),
        ids=EventBatch.IDS,
    )
    for in_run in (True, False)
    for budgeted in (True, False)
}


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
    sql = _TURN_OPENS[(quantum_run_id is not None, budgeted_wave_id is not None)]
    params: dict[str, Any] = {
        "phase": phase,
        "now": now,
        "id": agent_run_id,
        "qr": quantum_run_id,
        "agent_id": agent_id,
        "attempt": attempt,
        "wave": budgeted_wave_id,
        **events.params(),
        **(completion.params() if completion is not None else _NO_COMPLETION),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None  # a SELECT of subqueries always has its row
    running, spent, spent_wave, event_ids = row
    events.sent(event_ids)
    return (spent, spent_wave) if running else None


# CTE `usage`: one model call's row in the ledger. Parameters: `_usage_params`, run, now.
_USAGE_CTE = """usage AS (
    INSERT INTO {u_table} ({u_agent_run_id}, {u_quantum_run_id}, {u_wave_id}, {u_provider},
                           {u_model}, {u_tokens_in}, {u_tokens_out}, {u_cache_read_tokens},
                           {u_cache_write_tokens}, {u_cache_write_long_tokens}, {u_cost_usd},
                           {u_priced}, {u_created_at})
    VALUES (%(run)s, %(quantum_run)s, %(wave)s, %(provider)s, %(model)s, %(tokens_in)s,
            %(tokens_out)s, %(cache_read)s, %(cache_write)s, %(cache_write_long)s, %(cost)s,
            %(priced)s, %(now)s)
)""".format(**_U)


# One statement, atomic on its own: the turn, its usage, its tool calls (pending), the run's
# counters and phase, and the events.
_TURN_RECORD = """
WITH turn AS (
    INSERT INTO {t_table} ({t_agent_run_id}, {t_index}, {t_assistant}, {t_tool_results},
                           {t_stop_reason}, {t_complete}, {t_tokens_in}, {t_tokens_out},
                           {t_prompt}, {t_created_at})
    VALUES (%(run)s, %(index)s, %(assistant)s::jsonb, '[]'::jsonb, %(stop_reason)s, %(complete)s,
            %(tokens_in)s, %(tokens_out)s, %(prompt)s, %(now)s)
    RETURNING {t_id}
), {usage}, calls AS (
    INSERT INTO {c_table} ({c_agent_run_id}, {c_turn_index}, {c_tool_use_id}, {c_name},
                           {c_input}, {c_output}, {c_is_error}, {c_completed}, {c_duration_ms},
                           {c_created_at})
    SELECT %(run)s, %(index)s, c.id, c.name, c.input, '', false, false, 0, %(now)s
    FROM jsonb_to_recordset(%(calls)s::jsonb) AS c(id text, name text, input jsonb)
    RETURNING {c_id}, {c_tool_use_id}
), {counters}, {events}
SELECT (SELECT {t_id} FROM turn), ARRAY(SELECT {c_tool_use_id} FROM calls),
       ARRAY(SELECT {c_id} FROM calls), {ids}
""".format(
    **_T,
    **_C,
    usage=_USAGE_CTE,
    counters=agent_run_counters_cte(),
    events=EventBatch.cte(),
    ids=EventBatch.IDS,
)

# A model call made outside our turn loop (an agent CLI's, through the model gateway): its usage
# and the run's counters, in one statement. The run keeps its phase.
_USAGE_RECORD = f"""
WITH {_USAGE_CTE}, {agent_run_counters_cte()}
SELECT 1
"""


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


def _usage_params(call: TurnRecord | CallUsage) -> dict[str, Any]:
    """The `usage` CTE's parameters, and the run counters' tokens and cost."""
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
    }


def usage_record(call: CallUsage) -> None:
    """One model call's usage in the ledger, and its tokens and cost added to its run's."""
    with connection.cursor() as cursor:
        cursor.execute(
            _USAGE_RECORD,
            {**_usage_params(call), "phase": call.phase, "now": call.now},
        )


# A turn's completion on its own; or, with no turn, one tool call's result.
_TURN_COMPLETE = f"WITH {_COMPLETION} SELECT"


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
    with connection.cursor() as cursor:
        cursor.execute(
            _TURN_RECORD,
            {
                **_usage_params(record),
                "index": record.index,
                "assistant": json.dumps(record.assistant),
                "calls": json.dumps(calls),
                "stop_reason": record.stop_reason,
                "complete": not record.tool_uses,
                "prompt": record.prompt,
                "phase": record.phase,
                "now": record.now,
                **events.params(),
            },
        )
        row = cursor.fetchone()
    assert row is not None  # a SELECT of subqueries always has its row
    turn_id, tool_use_ids, call_ids, event_ids = row
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
    params: dict[str, Any] = {
        "call": call_id,
        "output": output,
        "is_error": is_error,
        "duration": duration_ms,
    }
    with connection.cursor() as cursor:
        cursor.execute(_TURN_COMPLETE, {**_NO_COMPLETION, **params})


def turn_feedback(*, turn_id: int, content: list[TextBlock]) -> None:
    """The runtime's answer to a final turn (a failed verification): stored as the turn's user
    reply, so the conversation a resumed run sends holds it, and the loop goes on."""
    AgentTurn.objects.filter(pk=turn_id).update(tool_results=content)


def turn_complete(completion: TurnCompletion) -> None:
    """Complete a turn in a statement of its own (no next turn opens to carry it)."""
    with connection.cursor() as cursor:
        cursor.execute(_TURN_COMPLETE, completion.params())


# The run's end, guarded (running -> done | error), with its session's end and the events; the
# events go in only with the transition (the caller writes those that still belong otherwise).
_RUN_FINISH = f"""
WITH {agent_run_finish_cte()},
{session_ended_cte(only_if="EXISTS (SELECT FROM run)")},
{EventBatch.cte(only_if="EXISTS (SELECT FROM run)")}
SELECT EXISTS (SELECT FROM run), {EventBatch.IDS}
"""


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
    with connection.cursor() as cursor:
        cursor.execute(
            _RUN_FINISH,
            {
                "id": agent_run_id,
                "status": status,
                "phase": phase,
                "result": result,
                "error": error,
                "now": now,
                "session_now": now,
                "session_id": session_id,
                **events.params(),
            },
        )
        row = cursor.fetchone()
    assert row is not None  # a SELECT of subqueries always has its row
    finished, event_ids = row
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
