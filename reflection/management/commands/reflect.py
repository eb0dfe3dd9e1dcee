"""`manage.py reflect --burst ID | --wave ID [--json]`: reflect on finished bursts now,
in-process, every stage in a row."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand, emit_json, parse_id, table
from reflection.models import ReflectionRun
from reflection.pipeline import reflect_burst


def run_data(burst_id: int, run: ReflectionRun | None, cached: bool) -> dict[str, Any]:
    if run is None:
        return {"burst": burst_id, "reflection_run": None, "status": None, "cached": cached}
    return {
        "burst": burst_id,
        "reflection_run": run.pk,
        "status": run.status,
        "cached": cached,
        "counts": run.counts,
        "timings": run.timings,
        "error": run.error,
        "deltas": [
            {"id": d.pk, "status": d.status, "text": d.text, "reason": d.reason}
            for d in run.deltas.order_by("pk")
        ],
    }


class Command(SafeCommand):
    help = "Reflect on a burst, or on every finished burst of a wave (stored result if done)."

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--burst", type=parse_id)
        which.add_argument("--wave", type=parse_id)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        from bursts.models import Burst, BurstPhase

        if options["burst"] is not None:
            burst_ids = list(Burst.objects.filter(pk=options["burst"]).values_list("pk", flat=True))
            if not burst_ids:
                raise CommandError(f"no burst #{options['burst']}")
        else:
            burst_ids = list(
                Burst.objects.filter(wave_id=options["wave"], phase=BurstPhase.DONE)
                .order_by("number")
                .values_list("pk", flat=True)
            )
            if not burst_ids:
                raise CommandError(f"no finished burst in wave #{options['wave']}")
        results = [run_data(b, *reflect_burst(b)) for b in burst_ids]
        if options["json"]:
            emit_json(self.stdout, results)
            return
        table(
            self.stdout,
            ["burst", "run", "status", "cached", "counts", "error"],
            [
                [
                    r["burst"],
                    r["reflection_run"],
                    r["status"],
                    r["cached"],
                    r.get("counts", {}),
                    r.get("error", ""),
                ]
                for r in results
            ],
        )
