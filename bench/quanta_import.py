"""Bulk import of 100,000 quanta and ~200,000 dependencies, against its floor in the same run.

Prints, for the backlog of bench/ready_query.py (JSON lines, every record keyed by its ref):

- the floor: each line read with `json.loads` and the same quanta and edges COPYed into
  unindexed temporary tables, measured first in the same run, so the ratio holds on a loaded
  machine where the seconds do not;
- the import: reading and checking the file (parse, validate, refs, cycles), then writing it
  (COPY, search vectors, indexes, the blocker counts, the commit), with the process's CPU;
- the same file imported again: every record found again by its key and left unchanged
  (the idempotent path reads what the quanta hold in bulk, not per record).

    .venv/bin/python bench/quanta_import.py        (needs `make services`)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import django_bench_db, scratch_dir
from bench.ready_query import write_backlog


def floor(path: Path) -> float:
    """Seconds to read every record with json.loads and COPY its quantum and edges into
    temporary tables without indexes, constraints or search vectors."""
    from django.db import connection, transaction

    start = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE floor_quanta (id bigint, title text, body text, priority int,"
            " labels varchar(64)[], status text) ON COMMIT DROP"
        )
        cursor.execute(
            "CREATE TEMP TABLE floor_edges (quantum_id bigint, depends_on_id bigint) ON COMMIT DROP"
        )
        ids: dict[str, int] = {}
        records = []
        with path.open() as f:
            for n, line in enumerate(f, start=1):
                record = json.loads(line)
                ids[record["ref"]] = n
                records.append(record)
        with cursor.copy("COPY floor_quanta FROM STDIN") as copy:
            for record in records:
                copy.write_row(
                    (ids[record["ref"]], record["title"], record.get("body", ""),
                     record.get("priority", 2), record.get("labels", []),
                     record.get("status", "open"))
                )  # fmt: skip
        with cursor.copy("COPY floor_edges FROM STDIN") as copy:
            for record in records:
                for target in record.get("depends_on", []):
                    copy.write_row((ids[record["ref"]], ids[target]))
    return time.perf_counter() - start


def main() -> None:
    django_bench_db("annihilation_bench_import")
    from django.conf import settings
    from django.db import connection

    from quanta import importer
    from quanta.models import Dependency, Quantum

    # The backlog (~25 MB of JSON lines) is over the default import limit, which guards uploads.
    settings.IMPORT_MAX_BYTES = 64 * 2**20
    path = scratch_dir("bench-import-") / "backlog.jsonl"
    edges = write_backlog(path)
    print(
        f"backlog: {path.stat().st_size / 2**20:.1f} MB, {edges:,} edges; load {os.getloadavg()[0]:.1f}"
    )

    floor_s = floor(path)
    print(f"floor (json.loads + COPY into unindexed tables): {floor_s:.1f} s")

    parsed: list[float] = []
    real_parse = importer.parse_import

    def parse_timed(p: Path) -> tuple[list[importer.Record], dict[int, str]]:
        started = time.perf_counter()
        try:
            return real_parse(p)
        finally:
            parsed.append(time.perf_counter() - started)

    importer.parse_import = parse_timed  # type: ignore[assignment]
    cpu = time.process_time()
    start = time.perf_counter()
    report = importer.quanta_import_report(path=path)
    import_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    assert len(report.created) == Quantum.objects.count() == 100_000
    assert Dependency.objects.count() == edges
    print(
        f"import: {import_s:.1f} s ({import_s / floor_s:.1f}x the floor; target < 30 s): "
        f"read and check {parsed[0]:.1f} s, write {import_s - parsed[0]:.1f} s; "
        f"this process's CPU {cpu_s:.1f} s"
    )

    start = time.perf_counter()
    again = importer.quanta_import_report(path=path)
    again_s = time.perf_counter() - start
    assert again.created == [] and len(again.unchanged) == 100_000
    print(
        f"import again, all unchanged: {again_s:.1f} s ({again_s / floor_s:.1f}x the floor): "
        f"read and check {parsed[1]:.1f} s"
    )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE quanta_comment, quanta_dependency, quanta_quantum CASCADE")


if __name__ == "__main__":
    main()
