"""The one writer of Session rows (threads of events: one per wave, burst, agent run...).

The agent loop opens and ends an agent run's session inside the statement that claims or
finishes the run (one round trip per step): it embeds the CTEs provided here, as it embeds the
`events` CTE of `core.events.EventBatch`. Table and column names come from the model.
"""

from __future__ import annotations

from core.models import Session
from core.sql import sql_names

_S = sql_names(Session)

# The id of a statement's session: the one found, else the one it opened.
SESSION_ID = "COALESCE((SELECT id FROM session_found), (SELECT id FROM session_opened))"


def session_found_cte(*, kind: Session.Kind) -> str:
    """CTE `session_found`: the id of the first session of `kind` following
    %(session_ref)s (NULL when there is none)."""
    return """session_found AS (
    SELECT min({id}) AS id FROM {table} WHERE {kind} = '{value}' AND {ref} = %(session_ref)s
)""".format(**_S, value=Session.Kind(kind).value)


def session_opened_cte(*, kind: Session.Kind, only_if: str) -> str:
    """CTE `session_opened`: a session of `kind` following %(session_ref)s, titled
    %(session_title)s, started at %(session_now)s; opened only when `only_if` (an SQL condition
    on the statement's other CTEs) holds and `session_found` found none."""
    return """session_opened AS (
    INSERT INTO {table} ({kind}, {ref}, {title}, {started_at})
    SELECT '{value}', %(session_ref)s, %(session_title)s, %(session_now)s
    WHERE {only_if} AND (SELECT id FROM session_found) IS NULL
    RETURNING {id}
)""".format(**_S, value=Session.Kind(kind).value, only_if=only_if)


def session_ended_cte(*, only_if: str) -> str:
    """CTE `session_ended`: session %(session_id)s ended at %(session_now)s, when `only_if` (an
    SQL condition on the statement's other CTEs) holds."""
    return """session_ended AS (
    UPDATE {table} SET {ended_at} = %(session_now)s
    WHERE {id} = %(session_id)s AND {only_if}
)""".format(**_S, only_if=only_if)


__all__ = ["SESSION_ID", "session_ended_cte", "session_found_cte", "session_opened_cte"]
