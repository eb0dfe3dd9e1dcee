"""The agent loop's hot writes in plain SQL: a turn's checkpoint and a tool call's result.

Every turn of every agent writes these rows, and a threads worker runs a hundred agents on one
core: Django compiles each ORM statement in ~0.3 ms of Python, more than its round trip costs.
The statements write exactly the rows the models describe (AgentTurn, Usage, ToolCall and the
run's counters); the tests read them back through the ORM, and reads stay in the ORM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from psychonauts.providers.base import ContentBlock, ToolResultBlock, ToolUseBlock

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
