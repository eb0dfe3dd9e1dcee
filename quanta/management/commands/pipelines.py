"""`manage.py pipelines load PATH... | list | show NAME`, each with --json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand, emit_json, subcommands, table
from quanta.pipeline_models import Pipeline
from quanta.pipelines.loader import PipelineInvalid
from quanta.pipelines.services import (
    DefaultPipelineTaken,
    PipelineNotFound,
    pipeline_get,
    pipeline_spec,
    pipelines_list,
    pipelines_load,
    shipped_pipelines_dir,
)


def pipeline_data(pipeline: Pipeline) -> dict[str, Any]:
    return {
        **pipeline_spec(pipeline, list(pipeline.stages.all())),
        "version": pipeline.version,
        "source": pipeline.source,
    }


class Command(SafeCommand):
    help = "Load pipelines from YAML and inspect them."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        load = add("load", "load pipeline YAML files or folders")
        load.add_argument("paths", nargs="*", type=Path, help=f"default: {shipped_pipelines_dir()}")
        load.add_argument(
            "--replace-default",
            action="store_true",
            help="let a pipeline marked `default: true` replace the current default",
        )
        add("list", "list pipelines")
        add("show", "show one pipeline and its stages").add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = bool(options["json"])
        match options["subcommand"]:
            case "load":
                paths = options["paths"] or [shipped_pipelines_dir()]
                try:
                    loaded = pipelines_load(
                        paths=paths, replace_default=bool(options["replace_default"])
                    )
                except DefaultPipelineTaken as exc:
                    raise CommandError(
                        f"{exc}; nothing loaded (--replace-default to replace it)"
                    ) from None
                except PipelineInvalid as exc:
                    if as_json:
                        emit_json(self.stdout, {"ok": False, "problems": exc.problems})
                    else:
                        for problem in exc.problems:
                            self.stderr.write(problem)
                    raise CommandError(f"{len(exc.problems)} problem(s): nothing loaded") from None
                if as_json:
                    emit_json(self.stdout, {"ok": True, "pipelines": [vars(x) for x in loaded]})
                else:
                    table(
                        self.stdout,
                        ["name", "version", "change", "source"],
                        [(x.name, x.version, x.change, x.source) for x in loaded],
                    )
            case "list":
                rows = list(pipelines_list())
                if as_json:
                    emit_json(self.stdout, [pipeline_data(p) for p in rows])
                else:
                    table(
                        self.stdout,
                        ["name", "version", "default", "labels", "kinds", "stages"],
                        [
                            (
                                p.name,
                                p.version,
                                "yes" if p.is_default else "",
                                ",".join(p.match_labels),
                                ",".join(p.match_kinds),
                                " -> ".join(s.name for s in p.stages.all()),
                            )
                            for p in rows
                        ],
                    )
            case "show":
                try:
                    pipeline = pipeline_get(name=options["name"])
                except PipelineNotFound as exc:
                    raise CommandError(str(exc)) from None
                data = pipeline_data(pipeline)
                if as_json:
                    emit_json(self.stdout, data)
                    return
                self.stdout.write(
                    f"{pipeline.name} v{pipeline.version}{' (default)' if pipeline.is_default else ''}"
                )
                if pipeline.description:
                    self.stdout.write(pipeline.description)
                self.stdout.write(
                    f"match labels: {', '.join(pipeline.match_labels) or '-'}  kinds: {', '.join(pipeline.match_kinds) or '-'}"
                )
                table(
                    self.stdout,
                    [
                        "#",
                        "stage",
                        "mode",
                        "agents",
                        "condition",
                        "retries",
                        "timeout",
                        "verify",
                        "verdict",
                    ],
                    [
                        (
                            s["index"],
                            s["name"],
                            s["mode"],
                            ", ".join(a["role"] for a in s["agents"]),
                            s["condition"],
                            s["retries"],
                            s["timeout_s"] or "",
                            f"yes ({s.get('verify_retries', 2)} retries)"
                            if s.get("verify")
                            else "",
                            s.get("verdict", "block"),
                        )
                        for s in data["stages"]
                    ],
                )
