"""Ready query at scale: 100,000 quanta and 200,000 dependencies.

Prints the import time, the ready query's p50/p95 over 200 calls (the first page, as the CLI
and UI ask, and the whole set, as a burst collects), why_not_ready on a 1,000-deep chain, and
search's p50/p95 per query shape and over all seven (each shape's answer checked first against
its definition computed in plain statements). The baseline for the ratio is the same ready page
computed as an anti-join over the dependency graph (what the trigger-kept counter replaces);
the two must agree row for row.

    .venv/bin/python bench/ready_query.py        (needs `make services`)
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import django_bench_db, ms, pct

if TYPE_CHECKING:
    from django.contrib.postgres.search import SearchQuery

N_QUANTA = 100_000
GROUP = 100  # quanta per project; dependencies stay inside a project
DEEP = 1_000  # a separate chain for why_not_ready
CALLS = 200
COMMON = [
    "auth",
    "cache",
    "api",
    "schema",
    "page",
    "login",
    "token",
    "session",
    "deploy",
    "queue",
    "worker",
    "index",
    "search",
]
# A realistic vocabulary: a few common domain words and a long tail of rarer ones.
RARE = [
    a + b + c
    for a in ("re", "de", "pro", "con", "ex", "in", "sub", "trans")
    for b in ("port", "form", "tract", "mit", "vert", "press", "duct", "scribe")
    for c in ("", "er", "ing", "ion", "al")
]


def write_backlog(path: Path) -> int:
    """Projects of 100 quanta: each waits on its predecessor (a chain) and on one random
    earlier quantum (a fan-in), about two edges per quantum; the first 40% of every project
    are closed. Plus one deep chain."""
    rng = random.Random(7)
    edges = 0
    with path.open("w") as f:
        for n in range(N_QUANTA - DEEP):
            group, i = divmod(n, GROUP)
            deps = []
            if i >= 1:
                deps.append(f"q{n - 1}")
            if i >= 2:
                deps.append(f"q{group * GROUP + rng.randrange(0, i - 1)}")
            deps = list(dict.fromkeys(deps))
            edges += len(deps)
            record = {
                "ref": f"q{n}",
                "title": f"{rng.choice(COMMON)} {rng.choice(RARE)} {rng.choice(RARE)} task {n}",
                "body": " ".join(rng.choice(RARE) for _ in range(20)) + " " + rng.choice(COMMON),
                "priority": rng.randrange(5),
                "labels": [f"team{group % 7}"],
                "depends_on": deps,
            }
            if i < GROUP * 0.4:
                record["status"] = "closed"
            f.write(json.dumps(record) + "\n")
        for d in range(DEEP):
            deps = [f"deep{d - 1}"] if d else []
            edges += len(deps)
            f.write(
                json.dumps({"ref": f"deep{d}", "title": f"deep step {d}", "depends_on": deps})
                + "\n"
            )
    return edges


def timed(fn: Callable[[], object], calls: int = CALLS) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    django_bench_db("annihilation_bench_ready")
    from django.conf import settings
    from django.db import connection

    # The backlog (~25 MB of JSON lines) is over the default import limit, which guards uploads.
    settings.IMPORT_MAX_BYTES = 64 * 2**20
    from django.db.models import Exists, OuterRef

    from quanta.importer import quanta_import
    from quanta.models import Dependency, Quantum
    from quanta.search import quanta_search
    from quanta.selectors import quanta_ready, quantum_why_not_ready

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE quanta_comment, quanta_dependency, quanta_quantum RESTART IDENTITY CASCADE"
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "backlog.jsonl"
        edges = write_backlog(path)
        start = time.perf_counter()
        ids = quanta_import(path=path)
        import_s = time.perf_counter() - start
    print(f"quanta: {len(ids):,}  dependencies: {edges:,}")
    print(
        f"bulk import (parse, validate, cycle check, insert, search index): {import_s:.1f} s  (target < 30 s)"
    )

    ready_count = quanta_ready().count()
    page = timed(lambda: list(quanta_ready(limit=100)))
    whole = timed(lambda: list(quanta_ready().values_list("id", flat=True)), calls=50)
    # Baseline: the same first page computed the textbook way, an anti-join over the graph.
    blockers = Dependency.objects.filter(quantum=OuterRef("pk"), kind="blocks").exclude(
        depends_on__status="closed"
    )
    anti_join = (
        Quantum.objects.filter(status="open")
        .filter(~Exists(blockers))
        .order_by("priority", "created_at", "id")
    )
    assert list(anti_join.values_list("id", flat=True)) == list(
        quanta_ready().values_list("id", flat=True)
    ), "the trigger-kept counter disagrees with the dependency graph"
    baseline = timed(lambda: list(anti_join[:100]))
    print(f"ready set: {ready_count:,} quanta")
    print(
        f"ready query, first 100 (CLI/UI page):  p50 {ms(pct(page, 50))}  p95 {ms(pct(page, 95))}  (target p50 < 25 ms)"
    )
    print(
        f"ready query, whole set (burst collect): p50 {ms(pct(whole, 50))}  p95 {ms(pct(whole, 95))}"
    )
    # One repository's ready page (a wave's collect): the walk of quantum_ready_repository.
    from repos.services import repository_default

    default_id = repository_default().pk
    assert list(quanta_ready(repository_id=default_id, limit=100)) == list(
        quanta_ready(limit=100)
    ), "every imported quantum is the default repository's"
    one_repo = timed(lambda: list(quanta_ready(repository_id=default_id, limit=100)))
    with connection.cursor() as cursor:
        sql, params = quanta_ready(repository_id=default_id, limit=100).query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = " / ".join(row[0].strip() for row in cursor.fetchall()[:2])
    print(
        f"ready query of one repository, first 100: p50 {ms(pct(one_repo, 50))}"
        f"  p95 {ms(pct(one_repo, 95))}  plan: {plan}"
    )
    print(
        f"baseline, anti-join over the dependency graph, first 100: p50 {ms(pct(baseline, 50))}"
        f"  -> the counter is {pct(baseline, 50) / pct(page, 50):.1f}x faster"
    )

    deep_tail = Quantum.objects.get(title=f"deep step {DEEP - 1}").pk
    why = timed(lambda: quantum_why_not_ready(quantum_id=deep_tail), calls=20)
    print(
        f"why_not_ready on a {DEEP}-deep chain: p50 {ms(pct(why, 50))}  ({len(quantum_why_not_ready(quantum_id=deep_tail).blockers)} blockers)"
    )

    queries = [
        "auth",
        "reporting",
        "session converter",
        '"deport extract"',
        "deploy OR queue",
        "trans*",
        "search -index",
    ]
    # The import leaves work for autovacuum (visibility map, the search index's pending list),
    # which would otherwise start at a random moment of the timings below: done first, as on a
    # backlog in steady state.
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {Quantum._meta.db_table}")
    search: list[float] = []
    plain: list[float] = []
    for query in queries:
        assert [(h.quantum.pk, h.rank) for h in quanta_search(query=query)] == plain_search(
            query
        ), f"search disagrees with its plain definition for {query!r}"
        samples = timed(partial(quanta_search, query=query), calls=20)
        search += samples
        # The same page by its plain definition: what the search costs without its planner.
        plain_samples = timed(partial(plain_search, query), calls=20)
        plain += plain_samples
        print(
            f"  search {query!r}: p50 {ms(pct(samples, 50))}  p95 {ms(pct(samples, 95))}"
            f"  (plain: p50 {ms(pct(plain_samples, 50))}  p95 {ms(pct(plain_samples, 95))})"
            f"  ({Quantum.objects.filter(search_vector=search_query(query)).count():,} matches)"
        )
    print(
        f"search (top 50, {len(queries)} query shapes): p50 {ms(pct(search, 50))}"
        f"  p95 {ms(pct(search, 95))}  (target p95 < 50 ms)"
    )
    print(
        f"  the same by the plain definition (no planner): p50 {ms(pct(plain, 50))}"
        f"  p95 {ms(pct(plain, 95))}"
    )


def search_query(query: str) -> SearchQuery:
    from django.conf import settings
    from django.contrib.postgres.search import SearchQuery

    from quanta.search import search_to_tsquery

    return SearchQuery(search_to_tsquery(query), search_type="raw", config=settings.SEARCH_CONFIG)


def plain_search(query: str, limit: int = 50) -> list[tuple[int, float]]:
    """quanta_search's answer by its definition, in plain statements: ranked over the newest
    SEARCH_RANK_CANDIDATES matches when that many are among the newest
    SEARCH_RANK_CANDIDATES * SEARCH_BROAD_DENSITY quanta, else over every match."""
    from django.conf import settings
    from django.contrib.postgres.search import SearchRank
    from django.db.models import F

    from quanta.models import Quantum
    from quanta.search import SEARCH_BROAD_DENSITY

    candidates = max(settings.SEARCH_RANK_CANDIDATES, limit)
    tsquery = search_query(query)
    matches = Quantum.objects.filter(search_vector=tsquery)
    window = Quantum.objects.order_by("-id").values("id")[: candidates * SEARCH_BROAD_DENSITY]
    newest = list(
        matches.filter(pk__in=window).order_by("-id").values_list("id", flat=True)[:candidates]
    )
    if len(newest) == candidates:
        matches = matches.filter(pk__in=newest)
    ranked = matches.annotate(rank=SearchRank(F("search_vector"), tsquery)).order_by(
        "-rank", "priority", "id"
    )[:limit]
    return [(q.pk, float(q.rank)) for q in ranked]


if __name__ == "__main__":
    main()
