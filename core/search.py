"""Full-text search: the query syntax every search box and `search` command shares, and
session search (events' payload text, grouped by the session they belong to)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.db import ProgrammingError, connection, transaction

from core.errors import BadSearchQuery
from core.models import Event, Session
from core.sql import sql_names

_TOKEN = re.compile(r'(-?)"([^"]*)"|(\S+)')
_WORD = re.compile(r"\w+", re.UNICODE)


def search_to_tsquery(query: str) -> str:
    """Turn an operator's query into a Postgres `to_tsquery` expression.

    Words are ANDed; `"a phrase"` must appear in order; `OR` between terms; `-term` excludes;
    `auth*` matches prefixes. Only word characters reach Postgres, so no input can break
    the tsquery syntax.
    """
    clauses: list[str] = []
    pending_or = False
    for match in _TOKEN.finditer(query):
        negate, phrase, bare = match.group(1), match.group(2), match.group(3)
        if bare == "OR":
            pending_or = bool(clauses)
            continue
        prefix = False
        if bare is not None:
            negate = "-" if bare.startswith("-") else ""
            prefix = bare.endswith("*")
            words = _WORD.findall(bare)
        else:
            words = _WORD.findall(phrase)
        if not words:
            continue
        term = " <-> ".join(words) + (":*" if prefix else "")
        if len(words) > 1:
            term = f"({term})"
        if negate:
            term = f"!{term}"
        if pending_or and clauses:
            clauses[-1] = f"({clauses[-1]} | {term})"
        else:
            clauses.append(term)
        pending_or = False
    if not clauses:
        raise BadSearchQuery(f"nothing to search for in {query!r}")
    if all(c.startswith("!") for c in clauses):
        raise BadSearchQuery("a search needs at least one term that is not excluded")
    return " & ".join(clauses)


# --- session search ----------------------------------------------------------------------------

# The configuration the search column is generated with (core.models.Event.search): the
# query's words are stemmed as the payload's were.
EVENT_SEARCH_CONFIG = "english"
QUERY_MAX = 1000  # characters: a query longer than any a person types is refused, not run
LIMIT_MAX = 500

# Sessions know nothing of agent runs (they live above core): an agent run's session has kind
# `agent_run` and the run's id as its ref, and its events are on `agent:<agent_id>`, where the
# agent id is `<quantum_id>_s<stage>_<role>`, `<quantum_id>_cli_<role>`, or a sub-agent's
# `<parent agent id>.t<turn>c<call>_<role>`. The quantum and role filters match that pattern.
_AGENT_TOPIC = re.compile(
    r"^agent:(?P<quantum>[0-9]+)_(?:.*[._])?(?:s[0-9]+|cli|t[0-9]+c[0-9]+)_(?P<role>[^.]+)$"
)
_ROLE = re.compile(r"[A-Za-z0-9_-]{1,100}")

# Highlight marks: control characters no payload text keeps (they are removed from the text
# before it is highlighted), so a snippet splits back into plain and matched parts exactly.
_MARK_ON, _MARK_OFF = "\x01", "\x02"

_E = sql_names(Event, "e_")
_S = sql_names(Session, "s_")

# The matching events come from the GIN index on the search column (event_search); the
# topic filters apply to those rows. Per session: how many events match, the best one (its
# rank, for the order and the snippet) and the latest (recency breaks ties). The snippet is
# computed for the `limit` sessions kept only: ts_headline reads the whole text.
_SESSIONS_SEARCH = """
WITH q AS (SELECT to_tsquery(%(config)s::regconfig, %(tsquery)s) AS q),
hits AS (
    SELECT e.{e_id} AS id, e.{e_session_id} AS session_id, e.{e_topic} AS topic,
           ts_rank(e.{e_search}, q.q) AS rank
    FROM {e_table} e, q
    WHERE e.{e_search} @@ q.q AND e.{e_session_id} IS NOT NULL {filters}
),
best AS (
    SELECT DISTINCT ON (session_id) session_id, id, rank
    FROM hits ORDER BY session_id, rank DESC, id DESC
),
grouped AS (
    SELECT session_id, count(*) AS matches, max(id) AS last_id,
           array_agg(DISTINCT topic ORDER BY topic) AS topics
    FROM hits GROUP BY session_id
),
kept AS (
    SELECT b.session_id, b.id AS event_id, b.rank, g.matches, g.last_id, g.topics
    FROM best b JOIN grouped g USING (session_id)
    ORDER BY b.rank DESC, g.last_id DESC
    LIMIT %(limit)s
)
SELECT s.{s_id}, s.{s_kind}, s.{s_ref}, s.{s_title}, s.{s_started_at}, s.{s_ended_at},
       k.matches, k.rank, k.topics, k.event_id,
       ts_headline(
           %(config)s::regconfig,
           translate(
               (SELECT string_agg(v #>> '{{}}', ' · ')
                FROM jsonb_path_query(e.{e_payload}, 'strict $.** ? (@.type() == "string")') v),
               %(marks)s, ''
           ),
           q.q,
           %(headline)s
       )
FROM kept k
JOIN {s_table} s ON s.{s_id} = k.session_id
JOIN {e_table} e ON e.{e_id} = k.event_id
CROSS JOIN q
ORDER BY k.rank DESC, k.last_id DESC
"""


@dataclass(frozen=True)
class SessionHit:
    """A session with events matching a search: the best event's snippet, and the agent run
    it follows when it is one (its ids read from the session and topic, see _AGENT_TOPIC)."""

    session_id: int
    kind: str
    title: str
    started_at: datetime
    ended_at: datetime | None
    matches: int
    rank: float
    topics: list[str]
    event_id: int  # the best-matching event
    snippet_parts: list[tuple[str, bool]]  # (text, matched)
    agent_run_id: int | None
    agent_id: str | None
    quantum_id: int | None
    role: str | None

    @property
    def snippet(self) -> str:
        """The snippet as one line of text, matches in [brackets]."""
        return "".join(f"[{text}]" if hit else text for text, hit in self.snippet_parts)


def _snippet_parts(headline: str | None) -> list[tuple[str, bool]]:
    parts: list[tuple[str, bool]] = []
    for n, chunk in enumerate(re.split(f"[{_MARK_ON}{_MARK_OFF}]", headline or "")):
        if chunk:
            parts.append((" ".join(chunk.split("\n")), n % 2 == 1))
    return parts


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def sessions_search(
    query: str,
    *,
    topic: str | None = None,
    quantum_id: int | None = None,
    role: str | None = None,
    limit: int = 50,
) -> list[SessionHit]:
    """Sessions whose events match `query` (the syntax of `search_to_tsquery`), most
    relevant first, then the most recent. Each event is matched on its own (an excluded word
    drops the events holding it, not their whole session).

    `topic` keeps events on that topic (`agent:*`: on topics starting `agent:`); `quantum_id`
    and `role` keep agents' events, of that quantum's agents and of agents in that role.
    Raises BadSearchQuery for a query with nothing to search for, or too long, or a role that
    no agent id could hold.
    """
    if len(query) > QUERY_MAX:
        raise BadSearchQuery(f"a search is at most {QUERY_MAX} characters")
    tsquery = search_to_tsquery(query)
    filters: list[str] = []
    params: dict[str, str | int] = {
        "config": EVENT_SEARCH_CONFIG,
        "tsquery": tsquery,
        "limit": max(1, min(limit, LIMIT_MAX)),
        "marks": _MARK_ON + _MARK_OFF,
        "headline": (
            f"StartSel={_MARK_ON}, StopSel={_MARK_OFF}, MaxWords=30, MinWords=10, "
            'MaxFragments=2, FragmentDelimiter=" … "'
        ),
    }
    if topic is not None:
        if "\x00" in topic:
            raise BadSearchQuery("a topic cannot contain a NUL character")
        if topic.endswith("*"):
            filters.append(f"AND e.{_E['e_topic']} LIKE %(topic)s")
            params["topic"] = _like_escape(topic[:-1]) + "%"
        else:
            filters.append(f"AND e.{_E['e_topic']} = %(topic)s")
            params["topic"] = topic
    if quantum_id is not None:
        filters.append(f"AND e.{_E['e_topic']} LIKE %(agent_prefix)s")
        params["agent_prefix"] = _like_escape(f"agent:{quantum_id}_") + "%"
    if role is not None:
        if not _ROLE.fullmatch(role):
            raise BadSearchQuery(f"{role!r} is not a role name (letters, digits, _ and -)")
        # The role is the agent id's last segment: after `_s<n>_`, `_cli_` or `.t<n>c<n>_`.
        filters.append(f"AND e.{_E['e_topic']} ~ %(role_pattern)s")
        params["role_pattern"] = (
            r"^agent:[0-9]+_(.*[._])?(s[0-9]+|cli|t[0-9]+c[0-9]+)_" + re.escape(role) + "$"
        )
    sql = _SESSIONS_SEARCH.format(**_E, **_S, filters=" ".join(filters))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [_hit(row) for row in rows]


# How many sessions match each of many queries, in one statement: per query, the distinct
# sessions of its matching events (from the GIN index on the search column), stopped at the
# limit. No rank and no snippet: a count needs neither.
_SESSIONS_COUNT = """
SELECT (
    SELECT count(*) FROM (
        SELECT DISTINCT e.{e_session_id}
        FROM {e_table} e
        WHERE e.{e_search} @@ to_tsquery(%(config)s::regconfig, p.tsquery)
          AND e.{e_session_id} IS NOT NULL
        LIMIT %(limit)s
    ) matching
)
FROM unnest(%(tsqueries)s::text[]) WITH ORDINALITY AS p(tsquery, n)
ORDER BY p.n
"""


def event_search_flush() -> bool:
    """Move the entries waiting in the event search index's pending list into the index proper;
    False when the database user may not (only the index's owner may).

    Postgres queues the GIN entries of new rows in a pending list (up to gin_pending_list_limit,
    4 MB by default) that every search reads through in full: just after a burst's agents wrote
    their events, each search costs milliseconds more than on the index proper. Merging them
    once (tens of milliseconds for a full list) before many searches is cheaper than reading
    the list in each. The rows and every search's result stay the same.
    """
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT gin_clean_pending_list('event_search'::regclass)")
    except ProgrammingError as exc:
        if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
            return False
        raise
    return True


def sessions_count(queries: Sequence[str], *, limit: int = LIMIT_MAX) -> list[int]:
    """For each query, how many sessions `sessions_search(query, limit=limit)` would return
    (the sessions with an event matching it, at most `limit`), all in one statement after the
    search index's pending entries are merged (event_search_flush). Raises BadSearchQuery as
    sessions_search does, for the first query it refuses."""
    tsqueries: list[str] = []
    for query in queries:
        if len(query) > QUERY_MAX:
            raise BadSearchQuery(f"a search is at most {QUERY_MAX} characters")
        tsqueries.append(search_to_tsquery(query))
    if not tsqueries:
        return []
    event_search_flush()
    params: dict[str, str | int | list[str]] = {
        "config": EVENT_SEARCH_CONFIG,
        "limit": max(1, min(limit, LIMIT_MAX)),
        "tsqueries": tsqueries,
    }
    with connection.cursor() as cursor:
        cursor.execute(_SESSIONS_COUNT.format(**_E), params)
        return [int(count) for (count,) in cursor.fetchall()]


def _hit(row: tuple[object, ...]) -> SessionHit:
    sid, kind, ref, title, started, ended, matches, rank, topics, event_id, headline = row
    topic_list = [str(t) for t in topics] if isinstance(topics, list) else []
    agent = next((m for m in map(_AGENT_TOPIC.match, topic_list) if m), None)
    agent_run_id = int(str(ref)) if kind == Session.Kind.AGENT_RUN and str(ref).isdigit() else None
    assert isinstance(started, datetime)
    return SessionHit(
        session_id=int(str(sid)),
        kind=str(kind),
        title=str(title),
        started_at=started,
        ended_at=ended if isinstance(ended, datetime) else None,
        matches=int(str(matches)),
        rank=float(str(rank)),
        topics=topic_list,
        event_id=int(str(event_id)),
        snippet_parts=_snippet_parts(headline if isinstance(headline, str) else None),
        agent_run_id=agent_run_id,
        agent_id=agent.group(0).removeprefix("agent:") if agent else None,
        quantum_id=int(agent.group("quantum")) if agent else None,
        role=agent.group("role") if agent else None,
    )


__all__ = [
    "BadSearchQuery",
    "SessionHit",
    "event_search_flush",
    "search_to_tsquery",
    "sessions_count",
    "sessions_search",
]
