"""Full-text search over quanta: `quanta_search` (ranked, for the search page and the `quanta
search` command) and `quanta_search_in_order` (a listing's order, for the API), each with the
small planner that picks between walking the newest quanta or a listing and asking the full-text
index, from Postgres's estimates (EXPLAIN). docs/performance.md ("How search stays fast") has the
figures each choice buys against the plain statements that give the same answers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.conf import settings
from django.contrib.postgres.search import SearchQuery
from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from psycopg import sql

from core.errors import BadSearchQuery as CoreBadSearchQuery
from core.search import search_to_tsquery as core_search_to_tsquery
from quanta.errors import BadSearchQuery
from quanta.models import Quantum


def search_to_tsquery(query: str) -> str:
    """The query syntax of `core.search.search_to_tsquery`, its error a quanta error."""
    try:
        return core_search_to_tsquery(query)
    except CoreBadSearchQuery as exc:
        raise BadSearchQuery(str(exc)) from None


@dataclass
class SearchHit:
    quantum: Quantum
    rank: float


# quanta_search: a query matching at least one quantum in SEARCH_BROAD_DENSITY of the newest is
# broad; it is ranked over its settings.SEARCH_RANK_CANDIDATES newest matches.
SEARCH_BROAD_DENSITY = 10
# quanta_search goes to the full-text index first when the planner expects fewer matches among
# the newest quanta than this share of SEARCH_RANK_CANDIDATES (so the query is likely narrow).
SEARCH_INDEX_FIRST_SHARE = 1.0


# `#12` (or `#12 #40`): the quanta of those ids, the way the operator names them everywhere.
_IDS_QUERY = re.compile(r"\s*(?:#\d{1,18}\s*)+")


def quanta_ids_in_query(query: str) -> list[int] | None:
    """The ids of a query made only of `#N` references; None for any other query."""
    if not _IDS_QUERY.fullmatch(query):
        return None
    return [int(n) for n in re.findall(r"#(\d+)", query)]


def quanta_search(*, query: str, limit: int = 50) -> list[SearchHit]:
    """Full-text search over title, labels, body and comments; best match first. A query of
    `#N` references finds those quanta.

    Every match is ranked, unless the query is broad: one matching at least one quantum in
    `SEARCH_BROAD_DENSITY` among the newest is ranked over its `SEARCH_RANK_CANDIDATES` newest
    matches (the setting of that name, or at least `limit`). Two statements answer it:

    - the walk: back along the primary key over the newest quanta (the window), testing each,
      stopped once `SEARCH_RANK_CANDIDATES` match. Cheap for a broad query (a prefix matching
      94,000 of 100,000 quanta stops after ~1,200 rows); a narrow one reads the whole window
      and learns only that it is narrow.
    - the index: every match from the full-text index, ranked; the same statement tells a
      broad query from a narrow one (the matches at or above the window's first id) and keeps
      the newest matches of a broad one, so it is exact on its own. Cheap for a narrow query;
      a broad one reads and ranks every match (94,000 rows for that prefix).

    The planner's estimate of the matches picks the first: the index when it expects the query
    narrow (fewer than `SEARCH_INDEX_FIRST_SHARE * SEARCH_RANK_CANDIDATES` matches in the
    window), else the walk, then the index if the walk finds the query narrow. Postgres
    estimates a word from its statistics and a phrase as its words ANDed (what the index hands
    over), but a prefix by a fixed guess: a query with a prefix walks first. Both statements
    rank and sort the sort key only (id, priority, rank) and read the page's rows by id.
    """
    ids = quanta_ids_in_query(query)
    if ids is not None:
        found = Quantum.objects.in_bulk(ids)
        return [SearchHit(found[i], 1.0) for i in dict.fromkeys(ids) if i in found][:limit]
    search = _RankedSearch(query, limit=limit)
    if not search.expected_narrow():
        hits = search.walk()
        if hits is not None:
            return hits
    return search.from_index()


class _RankedSearch:
    """The statements of quanta_search over one query."""

    def __init__(self, query: str, *, limit: int) -> None:
        self.limit = int(limit)
        self.candidates = max(int(settings.SEARCH_RANK_CANDIDATES), self.limit)
        self.window = self.candidates * SEARCH_BROAD_DENSITY
        self.tsquery = search_to_tsquery(query)
        # Every value is written into the statements' text, none bound as a parameter: the
        # project's connections prepare a statement run twice (DB_PREPARE_THRESHOLD), and after
        # five runs Postgres may switch a prepared statement to its generic plan, which knows
        # neither the query nor the limits (and walks far more than it needs). With the values
        # in the text, each plan is made for them.
        self.q = (
            f"to_tsquery({_literal(settings.SEARCH_CONFIG)}::regconfig, {_literal(self.tsquery)})"
        )
        self.table = Quantum._meta.db_table
        self.columns = ", ".join(
            f'w."{f.column}"' for f in Quantum._meta.concrete_fields if f.name != "search_vector"
        )

    def expected_narrow(self) -> bool:
        """Whether the planner expects fewer matches in the window than make a query broad
        (its estimate of the rows of the window the query keeps)."""
        if ":*" in self.tsquery:
            return False
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                EXPLAIN (FORMAT JSON)
                SELECT l.id FROM (SELECT id, search_vector FROM {self.table}
                                   ORDER BY id DESC LIMIT {self.window}) l
                 WHERE l.search_vector @@ {self.q}
                """
            )
            (plan,) = cursor.fetchone() or ('[{"Plan": {"Plan Rows": 0}}]',)
        plan = json.loads(plan) if isinstance(plan, str) else plan
        return float(plan[0]["Plan"]["Plan Rows"]) < SEARCH_INDEX_FIRST_SHARE * self.candidates

    def page(self, ranked: str) -> list[SearchHit]:
        """The best `limit` of `ranked` (a statement of id, priority, rank), read by id."""
        rows = Quantum.objects.raw(
            f"""
            WITH q AS (SELECT {self.q} AS q),
                 ranked AS MATERIALIZED ({ranked}),
                 page AS (SELECT * FROM ranked ORDER BY rank DESC, priority, id LIMIT {self.limit})
            SELECT {self.columns}, page.rank, page.broad
              FROM page JOIN {self.table} w ON w.id = page.id
             ORDER BY page.rank DESC, page.priority, page.id
            """
        )
        return [SearchHit(quantum=q, rank=float(q.rank)) for q in rows]  # type: ignore[attr-defined]

    def walk(self) -> list[SearchHit] | None:
        """The best matches among the newest `candidates` matches in the window, or None when
        the window holds fewer (the query is narrow)."""
        hits = self.page(
            f"""
            SELECT h.*, count(*) OVER () = {self.candidates} AS broad
              FROM (SELECT l.id, l.priority, ts_rank(l.search_vector, q.q) AS rank
                      FROM (SELECT id, priority, search_vector FROM {self.table}
                             ORDER BY id DESC LIMIT {self.window}) l, q
                     WHERE l.search_vector @@ q.q
                     ORDER BY l.id DESC
                     LIMIT {self.candidates}) h
            """
        )
        if hits and hits[0].quantum.broad:  # type: ignore[attr-defined]
            return hits
        return None

    def from_index(self) -> list[SearchHit]:
        """The best matches, from every match the full-text index hands over: all of them for
        a narrow query, the newest `candidates` for a broad one."""
        return self.page(
            f"""
            WITH m AS MATERIALIZED (
                     SELECT s.id, s.priority, ts_rank(s.search_vector, q.q) AS rank
                       FROM {self.table} s, q
                      WHERE s.search_vector @@ q.q
                 ),
                 start AS (SELECT id FROM {self.table}
                            ORDER BY id DESC OFFSET {self.window - 1} LIMIT 1),
                 b AS (SELECT count(*) = {self.candidates} AS broad
                         FROM (SELECT 1 FROM m
                                WHERE m.id >= coalesce((SELECT id FROM start), m.id)
                                LIMIT {self.candidates}) x)
            SELECT m.*, b.broad FROM m, b WHERE NOT b.broad
            UNION ALL
            (SELECT m.*, b.broad FROM m, b WHERE b.broad ORDER BY m.id DESC LIMIT {self.candidates})
            """
        )


# How far the in-order search walks a listing (quanta_search_in_order): first a window of
# IN_ORDER_WINDOW_PER_ROW rows of the listing per row asked for; then, when the matches found
# there say how far the rest are, one walk that far if it reads at most IN_ORDER_WALK_MAX_ROWS
# rows of the table and costs less than the full-text index; else the index. A window
# of 30 rows per row asked for (1,530 for a page of 50) answers a query matching one listed
# quantum in 30 in one statement: every query but a phrase at 100,000 quanta (bench/api_reads).
IN_ORDER_WINDOW_PER_ROW = 30
IN_ORDER_WALK_MAX_ROWS = 20_000
# What a row handed over by the full-text index costs, in rows of a walk: a walk reads a row of
# the index and one of the table; the index's rows are read by block (a bitmap), then sorted
# (the ratio measured is in docs/performance.md).
IN_ORDER_INDEX_ROW_COST = 4


def quanta_search_in_order(*, quanta: QuerySet[Quantum], query: str, count: int) -> list[Quantum]:
    """The first `count` quanta of `quanta` (ordered, its filters and cursor applied) matching
    `query`, in that order, each with its `rank`.

    Postgres cannot tell how many quanta a text query matches (it costs a phrase as its words
    ANDed, ~17x too many on a varied backlog, and a prefix by a fixed guess), so left to itself
    it walks the list's index testing every row for a rare phrase (74,000 rows read for one
    page), or builds and sorts the whole bitmap of a common prefix. Bounded steps instead:

    1. the first `count * IN_ORDER_WINDOW_PER_ROW` rows of the listing, walked in its order
       (the filters' own plan: their estimates are sound) and tested against the query; the
       walk stops as soon as `count` match.
    2. when that window is full but short of matches, the matches it held tell how far the
       walk would have to go, and the planner's estimate of the listing's size how many rows
       of the table that walk reads (a filter keeping one quantum in seven reads seven). If
       that is at most `IN_ORDER_WALK_MAX_ROWS` and less than the index would cost (the rows
       it hands over, by the planner's estimate, at `IN_ORDER_INDEX_ROW_COST` each), one walk
       twice that far (a few matches are a rough measure), within that bound.
    3. else, or if that walk falls short too: every match from the full-text index, its sort
       key only (`MATERIALIZED`, so the planner cannot turn it back into an ordered walk),
       sorted; the page's rows read by id.

    A walk costs a row of the listing's index and table per row read; the index costs a row of
    the table per match, so it wins only where the query is rare. The rank is computed for the
    rows returned only.
    """
    ids = quanta_ids_in_query(query)
    if ids is not None:
        named = list(quanta.filter(pk__in=ids)[:count])
        for q in named:
            q.rank = 1.0  # type: ignore[attr-defined]
        return named
    walk = _InOrderWalk(quanta, query, count)
    window = count * IN_ORDER_WINDOW_PER_ROW
    hits, full = walk.first(window)
    if len(hits) == count or not full:
        return hits
    if hits:
        needed = count * window // len(hits)
        listed, matched, table = walk.estimates()
        per_row = max(1.0, table / max(1.0, listed))
        if needed * per_row <= min(IN_ORDER_WALK_MAX_ROWS, IN_ORDER_INDEX_ROW_COST * matched):
            hits, full = walk.first(int(min(2 * needed, IN_ORDER_WALK_MAX_ROWS / per_row)))
            if len(hits) == count or not full:
                return hits
    return walk.from_index()


class _InOrderWalk:
    """The statements of quanta_search_in_order over one listing and query."""

    def __init__(self, quanta: QuerySet[Quantum], query: str, count: int) -> None:
        self.quanta, self.count = quanta, count
        self.search = _search_query(query)
        self.tsquery = [settings.SEARCH_CONFIG, search_to_tsquery(query)]
        self.columns = ", ".join(
            f'w."{f.column}"' for f in Quantum._meta.concrete_fields if f.name != "search_vector"
        )
        order = [{"pk": "id", "-pk": "-id"}.get(str(o), str(o)) for o in quanta.query.order_by]
        if not order:
            raise ValueError("the search needs the listing's order")
        self.order = order
        self.keys = [o.lstrip("-") for o in order]

    def by(self, alias: str) -> str:
        """The listing's order over `alias`, a relation with the keys' names as columns."""
        return ", ".join(
            f'{alias}."{k}"' + (" DESC" if o.startswith("-") else "")
            for o, k in zip(self.order, self.keys, strict=True)
        )

    def estimates(self) -> tuple[float, float, float]:
        """The planner's estimates of the rows in the listing, of the listing's rows the
        full-text index hands over (for a phrase, the rows holding its words: each is read to
        check the order), and of the table's rows. The listing's filters are plain columns, so
        the first holds; the second is what reading the index costs, whatever the matches."""
        with connection.cursor() as cursor:
            rows = []
            for qs in (self.quanta, self.quanta.filter(search_vector=self.search)):
                sql, params = qs.query.sql_with_params()
                cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
                (plan,) = cursor.fetchone() or ('[{"Plan": {"Plan Rows": 1}}]',)
                plan = json.loads(plan) if isinstance(plan, str) else plan
                rows.append(float(plan[0]["Plan"]["Plan Rows"]))
            cursor.execute(
                "SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                [Quantum._meta.db_table],
            )
            (table,) = cursor.fetchone() or (1.0,)
        return rows[0], rows[1], float(table)

    def first(self, window: int) -> tuple[list[Quantum], bool]:
        """The matches among the listing's first `window` rows (at most `count`), and whether
        the listing has that many rows. The window carries the sort key and whether each row
        matches (tested in the scan, so wide rows are not copied up the plan); its last row
        comes back even when it does not match, which tells a full window from the end."""
        listing, params = (
            self.quanta.annotate(
                hit=ExpressionWrapper(Q(search_vector=self.search), BooleanField())
            ).values("id", *[k for k in self.keys if k != "id"], "hit")[:window]
        ).query.sql_with_params()
        rows = list(
            Quantum.objects.raw(
                f"""
                SELECT {self.columns},
                       ts_rank(w.search_vector, to_tsquery(%s::regconfig, %s)) AS rank,
                       l.hit, l.position
                  FROM (SELECT l.*, row_number() OVER (ORDER BY {self.by("l")}) AS position
                          FROM ({listing}) l) l
                  JOIN {Quantum._meta.db_table} w ON w.id = l.id
                 WHERE l.hit OR l.position = %s
                 ORDER BY {self.by("l")}
                 LIMIT %s
                """,
                [*self.tsquery, *params, window, self.count],
            )
        )
        hits = [row for row in rows if row.hit]  # type: ignore[attr-defined]
        return hits, any(row.position == window for row in rows)  # type: ignore[attr-defined]

    def from_index(self) -> list[Quantum]:
        """The first `count` matches of the listing, found through the full-text index."""
        matches, params = (
            self.quanta.order_by()
            .filter(search_vector=self.search)
            .values("id", *[k for k in self.keys if k != "id"])
        ).query.sql_with_params()
        return list(
            Quantum.objects.raw(
                f"""
                WITH l AS MATERIALIZED ({matches}),
                     page AS (SELECT l.* FROM l ORDER BY {self.by("l")} LIMIT %s)
                SELECT {self.columns},
                       ts_rank(w.search_vector, to_tsquery(%s::regconfig, %s)) AS rank
                  FROM page JOIN {Quantum._meta.db_table} w ON w.id = page.id
                 ORDER BY {self.by("page")}
                """,
                [*params, self.count, *self.tsquery],
            )
        )


def _literal(value: str) -> str:
    """`value` as an SQL string literal."""
    return sql.Literal(value).as_string(None)


def _search_query(query: str) -> SearchQuery:
    return SearchQuery(search_to_tsquery(query), search_type="raw", config=settings.SEARCH_CONFIG)
