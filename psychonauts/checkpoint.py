"""The agent loop's hot writes in plain SQL: opening a turn, its checkpoint, a tool's result.

Every turn of every agent writes these rows, and a threads worker runs a hundred agents on one
core: Django compiles each ORM statement in ~0.3 ms of Python, more than its round trip costs.
The statements write exactly the rows the models describe (AgentTurn, Usage, ToolCall and the
run's phase and counters); the tests read them back through the ORM, and other reads stay there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from psychonauts.providers.base import ContentBlock, ToolResultBlock, ToolUseBlock

# Opening a turn is one round trip: the phase and heartbeat go in, and the spend the budgets
# need comes back; no row comes back when the run is no longer running (cancelled meanwhile).
_TURN_OPEN = """
UPDATE bursts_agentrun SET phase = %(phase)s, heartbeat_at = %(now)s
WHERE id = %(id)s AND status = 'running'
RETURNING {run}, {wave}
"""
_SPEND_RUN = (
    "(SELECT COALESCE(SUM(cost_usd), 0) FROM psychonauts_usage WHERE quantum_run_id = %(qr)s)"
)
_SPEND_ALONE = (
    "(SELECT COALESCE(SUM(u.cost_usd), 0) FROM psychonauts_usage u"
    " JOIN bursts_agentrun r ON r.id = u.agent_run_id"
    " WHERE r.agent_id = %(agent_id)s AND r.attempt = %(attempt)s)"
)
_SPEND_WAVE = "(SELECT COALESCE(SUM(cost_usd), 0) FROM psychonauts_usage WHERE wave_id = %(wave)s)"


def turn_open(
    *,
    agent_run_id: int,
    phase: str,
    now: datetime,
    quantum_run_id: int | None,
    agent_id: str,
    attempt: int,
    budgeted_wave_id: int | None,
) -> tuple[Decimal, Decimal | None] | None:
    """Write the phase; return what the quantum run (or the lone agent run) has spent, and the
    wave when it has a budget, or None when the run is no longer running."""
    sql = _TURN_OPEN.format(
        run=_SPEND_RUN if quantum_run_id is not None else _SPEND_ALONE,
        wave=_SPEND_WAVE if budgeted_wave_id is not None else "NULL",
    )
    params: dict[str, str | int | datetime | None] = {
        "phase": phase,
        "now": now,
        "id": agent_run_id,
        "qr": quantum_run_id,
        "agent_id": agent_id,
        "attempt": attempt,
        "wave": budgeted_wave_id,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


# One statement: the turn, its usage, its tool calls (pending) and the run's counters and
# phase. Atomic on its own; the caller adds the events in the same transaction.
_TURN_RECORD = """
WITH turn AS (
    INSERT INTO psychonauts_agentturn (agent_run_id, index, assistant, tool_results, stop_reason,
                                       complete, tokens_in, tokens_out, created_at)
    VALUES (%(run)s, %(index)s, %(assistant)s::jsonb, '[]'::jsonb, %(stop_reason)s, %(complete)s,
            %(tokens_in)s, %(tokens_out)s, %(now)s)
    RETURNING id
), usage AS (
    INSERT INTO psychonauts_usage (agent_run_id, quantum_run_id, wave_id, provider, model,
                                   tokens_in, tokens_out, cost_usd, created_at)
    VALUES (%(run)s, %(quantum_run)s, %(wave)s, %(provider)s, %(model)s, %(tokens_in)s,
            %(tokens_out)s, %(cost)s, %(now)s)
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
)
SELECT (SELECT id FROM turn), ARRAY(SELECT tool_use_id FROM calls), ARRAY(SELECT id FROM calls)
"""

_TOOL_CALL_DONE = """
UPDATE psychonauts_toolcall SET output = %s, is_error = %s, completed = true, duration_ms = %s
WHERE id = %s
"""

_TURN_COMPLETE = """
UPDATE psychonauts_agentturn SET tool_results = %s::jsonb, complete = true WHERE id = %s
"""


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
    cost_usd: Decimal
    phase: str
    now: datetime


def turn_record(record: TurnRecord) -> tuple[int, dict[str, int]]:
    """Write a provider's answer; returns the turn's id and its tool calls' ids by tool_use id."""
    calls = [{"id": u["id"], "name": u["name"], "input": u["input"]} for u in record.tool_uses]
    with connection.cursor() as cursor:
        cursor.execute(
            _TURN_RECORD,
            {
                "run": record.agent_run_id,
                "quantum_run": record.quantum_run_id,
                "wave": record.wave_id,
                "index": record.index,
                "assistant": json.dumps(record.assistant),
                "calls": json.dumps(calls),
                "stop_reason": record.stop_reason,
                "complete": not record.tool_uses,
                "tokens_in": record.tokens_in,
                "tokens_out": record.tokens_out,
                "provider": record.provider,
                "model": record.model,
                "cost": record.cost_usd,
                "phase": record.phase,
                "now": record.now,
            },
        )
        row = cursor.fetchone()
    assert row is not None  # a SELECT of subqueries always has its row
    turn_id, tool_use_ids, call_ids = row
    return int(turn_id), dict(zip(tool_use_ids, call_ids, strict=True))


def tool_call_done(*, call_id: int, output: str, is_error: bool, duration_ms: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_TOOL_CALL_DONE, [output, is_error, duration_ms, call_id])


def turn_complete(*, turn_id: int, tool_results: list[ToolResultBlock]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_TURN_COMPLETE, [json.dumps(tool_results), turn_id])
