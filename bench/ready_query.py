"""Ready query at scale: 100,000 quanta and 200,000 dependencies.

Prints the import time, the ready query's p50/p95 over 200 calls (the first page, as the CLI
and UI ask, and the whole set, as a burst collects), why_not_ready on a 1,000-deep chain, and
search. A trivial indexed scan of open quanta in the same order is the baseline for the ratio.

    .venv/bin/python bench/ready_query.py        (needs `make services`)
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _setup import django_bench_db, ms, pct  # noqa: E402

N_QUANTA = 100_000
GROUP = 100  # quanta per project; dependencies stay inside a project
DEEP = 1_000  # a separate chain for why_not_ready
CALLS = 200
WORDS = "auth cache api schema page login token session deploy queue worker index search".split()


def write_backlog(path: Path) -> int:
    """Projects of 100 quanta: each waits on its predecessor (a chain) and on one random
    earlier quantum (fan-in); the first 40% of every project are closed. Plus one deep chain."""
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
            if i >= 3:
                deps.append(f"q{group * GROUP + rng.randrange(0, i - 2)}")
            deps = list(dict.fromkeys(deps))
            edges += len(deps)
            record = {
                "ref": f"q{n}",
                "title": f"{rng.choice(WORDS)} {rng.choice(WORDS)} task {n}",
                "body": " ".join(rng.choice(WORDS) for _ in range(12)),
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


def timed(fn, calls: int = CALLS) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    django_bench_db()
    from django.db import connection

    from quanta.importer import quanta_import
    from quanta.models import Quantum
    from quanta.selectors import quanta_ready, quanta_search, quantum_why_not_ready

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
    baseline = timed(
        lambda: list(
            Quantum.objects.filter(status="open").order_by("priority", "created_at", "id")[:100]
        )
    )
    print(f"ready set: {ready_count:,} quanta")
    print(
        f"ready query, first 100 (CLI/UI page):  p50 {ms(pct(page, 50))}  p95 {ms(pct(page, 95))}  (target p50 < 25 ms)"
    )
    print(
        f"ready query, whole set (burst collect): p50 {ms(pct(whole, 50))}  p95 {ms(pct(whole, 95))}"
    )
    print(
        f"baseline (open quanta in order, no dependency check): p50 {ms(pct(baseline, 50))}  -> ready/baseline {pct(page, 50) / pct(baseline, 50):.1f}x"
    )

    deep_tail = Quantum.objects.get(title=f"deep step {DEEP - 1}").pk
    why = timed(lambda: quantum_why_not_ready(quantum_id=deep_tail), calls=20)
    print(
        f"why_not_ready on a {DEEP}-deep chain: p50 {ms(pct(why, 50))}  ({len(quantum_why_not_ready(quantum_id=deep_tail).blockers)} blockers)"
    )

    queries = ["auth", "session token", '"cache api"', "deploy OR queue", "log*", "search -index"]
    search = []
    for q in queries:
        search += timed(lambda q=q: quanta_search(query=q), calls=20)
    print(
        f"search (top 50, {len(queries)} query shapes): p50 {ms(pct(search, 50))}  p95 {ms(pct(search, 95))}"
    )


if __name__ == "__main__":
    main()
