"""Search's bounded query paths: in the list's order (a walk of the listing, or the full-text
index when the query is rare in it) and best match first (every match ranked, or a broad
query's newest matches); each path returns exactly the rows its definition names."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from quanta import search, selectors, services
from quanta.errors import BadSearchQuery
from quanta.models import Quantum
from quanta.services import search_refresh
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db

ORDER = ("priority", "created_at", "id")


def backlog() -> list[Quantum]:
    """24 quanta over three labels and five priorities: "common" in every title; in the bodies
    "rare" (quanta 3, 9, 15 and 21, all labelled red), "teamwork" (every red one) and
    "forgotten" (quanta 0 and 17)."""
    made = []
    for i in range(24):
        label = ["red", "green", "blue"][i % 3]
        words = [
            "rare" if i % 6 == 3 else "plain",
            "teamwork" if label == "red" else "",
            "forgotten" if i in (0, 17) else "",
        ]
        made.append(
            make_quantum(
                f"common task {i}", body=" ".join(words), priority=(i * 7) % 5, labels=[label]
            )
        )
    return made


def expected_in_order(query: str, label: str | None = None) -> list[int]:
    tsquery = SearchQuery(search.search_to_tsquery(query), search_type="raw", config="english")
    qs = Quantum.objects.filter(search_vector=tsquery).order_by(*ORDER)
    if label is not None:
        qs = qs.filter(labels__contains=[label])
    return list(qs.values_list("id", flat=True))


def in_order(query: str, *, count: int, label: str | None = None) -> tuple[list[int], list[str]]:
    """The ids found, and the steps taken: "walk" per walk of the listing, "index" for the
    full-text index."""
    listing = selectors.quanta_browse(label=label).order_by(*ORDER)
    with CaptureQueriesContext(connection) as queries:
        rows = search.quanta_search_in_order(quanta=listing, query=query, count=count)
    assert all(getattr(row, "rank") > 0 for row in rows)  # noqa: B009
    steps = [
        "index" if "MATERIALIZED" in q["sql"] else "walk"
        for q in queries.captured_queries
        if "row_number()" in q["sql"] or "MATERIALIZED" in q["sql"]
    ]
    return [row.pk for row in rows], steps


def test_it_walks_the_listing_when_the_query_is_common_in_it(monkeypatch: Any) -> None:
    backlog()
    monkeypatch.setattr(search, "IN_ORDER_WINDOW_PER_ROW", 2)
    found, steps = in_order("common", count=4)
    assert found == expected_in_order("common")[:4]
    assert steps == ["walk"]


def test_it_walks_on_when_the_window_shows_the_matches_are_near(monkeypatch: Any) -> None:
    backlog()
    # Red, in order: 0, 15, 3, 18, 6, 21, 9, 12; "rare": 15, 3, 21, 9. A window of 3 holds 2:
    # 3 matches are expected within 3 * 3 / 2 = 4 rows, walked twice as far (8 rows).
    monkeypatch.setattr(search, "IN_ORDER_WINDOW_PER_ROW", 1)
    monkeypatch.setattr(search, "IN_ORDER_INDEX_ROW_COST", 1000)  # the walk is cheaper
    found, steps = in_order("rare", count=3, label="red")
    assert found == expected_in_order("rare", label="red")[:3]
    assert steps == ["walk", "walk"]
    # The index is cheaper (each row it hands over costs nothing): the index.
    monkeypatch.setattr(search, "IN_ORDER_INDEX_ROW_COST", 0)
    found, steps = in_order("rare", count=3, label="red")
    assert found == expected_in_order("rare", label="red")[:3]
    assert steps == ["walk", "index"]
    monkeypatch.setattr(search, "IN_ORDER_INDEX_ROW_COST", 1000)
    # A walk that far reads more of the table than allowed: the index instead.
    monkeypatch.setattr(search, "IN_ORDER_WALK_MAX_ROWS", 3)
    found, steps = in_order("rare", count=3, label="red")
    assert found == expected_in_order("rare", label="red")[:3]
    assert steps == ["walk", "index"]


def test_it_turns_to_the_index_when_the_query_is_rare_in_the_listing(monkeypatch: Any) -> None:
    backlog()
    monkeypatch.setattr(search, "IN_ORDER_WINDOW_PER_ROW", 1)
    # The first 3 rows of the listing (0, 5, 10: priority 0) hold none of the "rare" quanta.
    found, steps = in_order("rare", count=3)
    assert found == expected_in_order("rare")[:3]
    assert steps == ["walk", "index"]


def test_it_answers_from_the_walk_when_the_listing_ends_inside_the_window() -> None:
    backlog()
    found, steps = in_order("rare", count=10)
    assert found == expected_in_order("rare")
    assert steps == ["walk"]


def ranked(query: str, among: list[int] | None = None) -> list[tuple[int, float]]:
    tsquery = SearchQuery(search.search_to_tsquery(query), search_type="raw", config="english")
    qs = Quantum.objects.filter(search_vector=tsquery)
    if among is not None:
        qs = qs.filter(pk__in=among)
    qs = qs.annotate(rank=SearchRank(F("search_vector"), tsquery)).order_by(
        "-rank", "priority", "id"
    )
    return [(q.pk, float(q.rank)) for q in qs]


def hits(query: str, limit: int) -> list[tuple[int, float]]:
    return [(h.quantum.pk, h.rank) for h in search.quanta_search(query=query, limit=limit)]


def test_a_broad_query_is_ranked_over_its_newest_matches(settings: Any) -> None:
    made = backlog()
    # A body that outranks every other match of "common", made first: among the oldest.
    Quantum.objects.filter(pk=made[0].pk).update(title="common common common")
    search_refresh([made[0].pk])
    settings.SEARCH_RANK_CANDIDATES = 4
    newest = sorted((q.pk for q in made), reverse=True)[:4]
    assert hits("common", limit=3) == ranked("common", among=newest)[:3]
    assert made[0].pk not in [pk for pk, _ in hits("common", limit=3)]
    # With room for every match, the best one overall comes first.
    settings.SEARCH_RANK_CANDIDATES = 100
    assert hits("common", limit=3) == ranked("common")[:3]
    assert hits("common", limit=3)[0][0] == made[0].pk


def test_a_query_rare_among_the_newest_is_ranked_over_every_match(settings: Any) -> None:
    made = backlog()
    settings.SEARCH_RANK_CANDIDATES = 2
    # "forgotten": one match among the newest 20 (2 * SEARCH_BROAD_DENSITY), one older.
    assert search.SEARCH_BROAD_DENSITY == 10
    assert hits("forgotten", limit=2) == ranked("forgotten")
    assert {pk for pk, _ in hits("forgotten", limit=2)} == {made[0].pk, made[17].pk}


def ranked_search(query: str, limit: int) -> tuple[list[tuple[int, float]], list[str]]:
    """The hits, and the statements run: "estimate" (the planner's), "walk" (the newest
    quanta), "index" (every match)."""
    with CaptureQueriesContext(connection) as queries:
        found = hits(query, limit)
    steps = []
    for q in queries.captured_queries:
        if "EXPLAIN" in q["sql"]:
            steps.append("estimate")
        elif "count(*) OVER ()" in q["sql"]:
            steps.append("walk")
        elif "AS broad" in q["sql"]:
            steps.append("index")
    assert len(steps) == len(queries.captured_queries)
    return found, steps


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Quantum._meta.db_table}")


def test_a_word_rare_among_the_newest_goes_to_the_index_only(settings: Any) -> None:
    made = backlog()
    analyze()
    settings.SEARCH_RANK_CANDIDATES = 3  # the estimate: 2 of the newest 30 quanta (all 24)
    found, steps = ranked_search("forgotten", limit=2)
    assert found == ranked("forgotten")
    assert {pk for pk, _ in found} == {made[0].pk, made[17].pk}
    assert steps == ["estimate", "index"]


def test_a_word_common_among_the_newest_is_answered_by_the_walk(settings: Any) -> None:
    made = backlog()
    analyze()
    settings.SEARCH_RANK_CANDIDATES = 4
    newest = sorted((q.pk for q in made), reverse=True)[:4]
    found, steps = ranked_search("common", limit=3)
    assert found == ranked("common", among=newest)[:3]
    assert steps == ["estimate", "walk"]


def test_a_prefix_walks_first_without_an_estimate(settings: Any) -> None:
    made = backlog()
    analyze()
    settings.SEARCH_RANK_CANDIDATES = 4
    newest = sorted((q.pk for q in made), reverse=True)[:4]
    found, steps = ranked_search("comm*", limit=3)
    assert found == ranked("comm*", among=newest)[:3]
    assert steps == ["walk"]
    # A prefix rare among the newest: the walk finds it narrow, then the index ranks every match.
    found, steps = ranked_search("forgot*", limit=3)
    assert found == ranked("forgot*")
    assert steps == ["walk", "index"]


def test_each_statement_is_exact_whatever_the_estimate(settings: Any, monkeypatch: Any) -> None:
    made = backlog()
    Quantum.objects.filter(pk=made[0].pk).update(title="common common common")
    search_refresh([made[0].pk])
    analyze()
    settings.SEARCH_RANK_CANDIDATES = 4
    newest = sorted((q.pk for q in made), reverse=True)[:4]
    # Expected narrow, but broad: the index keeps the newest matches only.
    monkeypatch.setattr(search, "SEARCH_INDEX_FIRST_SHARE", 1000.0)
    found, steps = ranked_search("common", limit=3)
    assert found == ranked("common", among=newest)[:3]
    assert made[0].pk not in [pk for pk, _ in found]
    assert steps == ["estimate", "index"]
    # Expected broad, but narrow: the walk finds it so, and the index ranks every match.
    monkeypatch.setattr(search, "SEARCH_INDEX_FIRST_SHARE", 0.0)
    found, steps = ranked_search("forgotten", limit=3)
    assert found == ranked("forgotten")
    assert steps == ["estimate", "walk", "index"]
    # A phrase, an exclusion, an alternative and no match, each by either statement.
    for share in (0.0, 1000.0):
        monkeypatch.setattr(search, "SEARCH_INDEX_FIRST_SHARE", share)
        for query in ('"common task"', "common -teamwork", "rare OR forgotten", "nothing"):
            assert ranked_search(query, limit=3)[0] == definition(query, limit=3, candidates=4)


def definition(query: str, *, limit: int, candidates: int) -> list[tuple[int, float]]:
    """quanta_search's answer by its definition: ranked over the newest `candidates` matches
    when that many are among the newest `candidates * SEARCH_BROAD_DENSITY` quanta, else over
    every match."""
    tsquery = SearchQuery(search.search_to_tsquery(query), search_type="raw", config="english")
    window = Quantum.objects.order_by("-id")[: candidates * search.SEARCH_BROAD_DENSITY]
    newest = list(
        Quantum.objects.filter(search_vector=tsquery, pk__in=window.values("id"))
        .order_by("-id")
        .values_list("id", flat=True)[:candidates]
    )
    return ranked(query, among=newest if len(newest) == candidates else None)[:limit]


def test_its_statements_bind_no_parameters_for_a_generic_plan_to_forget(settings: Any) -> None:
    # Prepared statements (DB_PREPARE_THRESHOLD) run with bound parameters may switch to a
    # generic plan that knows neither the query nor the limits; the values are in the text.
    backlog()
    analyze()
    settings.SEARCH_RANK_CANDIDATES = 3
    for _ in range(8):
        hits("common", limit=3)
        hits("forgotten", limit=3)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT parameter_types FROM pg_prepared_statements"
            " WHERE statement LIKE '%%AS broad%%' OR statement LIKE '%%EXPLAIN%%'"
        )
        prepared = [types for (types,) in cursor.fetchall()]
    assert len(prepared) >= 2
    assert all(not types for types in prepared)


# --- the search page and command: what a query finds ------------------------------------------


@pytest.fixture
def corpus():
    return {
        "auth": make_quantum("Authentication for the API", body="tokens and sessions"),
        "authz": make_quantum("Authorization rules", body="roles for users"),
        "sock": make_quantum("Websocket reconnect", body="the client is running out of retries"),
        "phrase": make_quantum("Cache layer", body="use the redis cache for session data"),
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("run", ["sock"]),  # stemming: running ~ run
        ("auth*", ["auth", "authz"]),  # prefix
        ('"session data"', ["phrase"]),  # phrase
        ('"data session"', []),  # phrase order matters
        ("websocket OR authorization", ["authz", "sock"]),
        ("session -cache", ["auth"]),  # exclusion
        ("tokens sessions", ["auth"]),  # AND
    ],
)
def test_search_supports_stemming_phrases_or_exclusion_and_prefix(corpus, query, expected):
    found = {h.quantum.pk for h in search.quanta_search(query=query)}
    assert found == {corpus[k].pk for k in expected}


def test_search_ranks_title_matches_first(corpus):
    body_match = make_quantum("Unrelated", body="authorization appears only here")
    hits = search.quanta_search(query="authorization")
    assert [h.quantum.pk for h in hits] == [corpus["authz"].pk, body_match.pk]


@pytest.mark.parametrize("query", ["", "   ", "-only", "!!! &&& |||"])
def test_search_refuses_empty_or_only_negative_queries(query):
    with pytest.raises(BadSearchQuery):
        search.quanta_search(query=query)


def test_search_survives_tsquery_syntax_in_input(corpus):
    hits = search.quanta_search(query="auth:* & !(x) <-> 'cache'")
    assert {h.quantum.pk for h in hits} <= {q.pk for q in corpus.values()}


def test_search_finds_labels_as_written_and_after_a_relabel():
    labelled = make_quantum("Rotate the keys", labels=["auth", "ops"])
    other = make_quantum("Cache warm-up", labels=["perf"])
    assert [h.quantum.pk for h in search.quanta_search(query="auth*")] == [labelled.pk]
    assert [h.quantum.pk for h in search.quanta_search(query="ops")] == [labelled.pk]

    services.quantum_update(quantum_id=other.pk, changes={"labels": ["auth"]})

    found = {h.quantum.pk for h in search.quanta_search(query="auth")}
    assert found == {labelled.pk, other.pk}


def test_search_finds_a_quantum_by_its_id():
    a, b = make_quantum("first"), make_quantum("second, mentions 12 in passing")
    assert [h.quantum.pk for h in search.quanta_search(query=f"#{a.pk}")] == [a.pk]
    found = search.quanta_search(query=f"#{b.pk} #{a.pk} #999999")
    assert [h.quantum.pk for h in found] == [b.pk, a.pk]
    listed = search.quanta_search_in_order(
        quanta=Quantum.objects.order_by("-pk"), query=f"#{a.pk}", count=10
    )
    assert [q.pk for q in listed] == [a.pk]
