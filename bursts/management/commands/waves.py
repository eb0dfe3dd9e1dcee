"""`manage.py waves list | show ID | cancel ID`, each with --json."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from bursts.errors import BurstsError
from bursts.management.commands.start_wave import summary
from bursts.selectors import wave_data, wave_detail, waves_list
from bursts.services import wave_cancel
from core.cli import SafeCommand, emit_json, parse_id, positive_int, subcommands, table


class Command(SafeCommand):
    help = "List, inspect and cancel waves."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        add("list", "recent waves").add_argument("--limit", type=positive_int, default=50)
        add("show", "a wave with its bursts, runs and agents").add_argument(
            "wave_id", type=parse_id
        )
        p = add("cancel", "cancel a running wave")
        p.add_argument("wave_id", type=parse_id)
        p.add_argument("--reason", default="cancelled by the operator")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = bool(options["json"])
        try:
            match options["subcommand"]:
                case "list":
                    waves = [wave_data(w) for w in waves_list(limit=options["limit"])]
                    if as_json:
                        emit_json(self.stdout, waves)
                        return
                    table(
                        self.stdout,
                        ["id", "status", "bursts", "runs", "labels", "started", "duration s"],
                        [
                            (
                                w["id"],
                                w["status"],
                                w["bursts"],
                                w["stats"]["runs_total"],
                                ",".join(w["labels"]) or "(all)",
                                w["started_at"].strftime("%Y-%m-%d %H:%M:%S"),
                                w["stats"]["duration_s"],
                            )
                            for w in waves
                        ],
                    )
                case "show":
                    detail = wave_detail(wave_id=options["wave_id"])
                    if as_json:
                        emit_json(self.stdout, detail)
                    else:
                        summary(self, detail)
                case "cancel":
                    wave = wave_cancel(wave_id=options["wave_id"], reason=options["reason"])
                    if as_json:
                        emit_json(self.stdout, wave_data(wave))
                    else:
                        self.stdout.write(f"wave {wave.pk} cancelled")
        except BurstsError as exc:
            raise CommandError(str(exc)) from None
