"""`repos env build|show|log`: the handlers of the environments' subcommands, kept apart from
the `repos` command so that any `repos` command can mount them (`env_arguments`, `env_handle`)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser, OutputWrapper

from core.cli import emit_json, parse_id, shorten, table
from psychonauts.environments.models import EnvironmentBuild
from psychonauts.environments.services import (
    build_get,
    environment_ensure,
    environment_rebuild,
    host_name,
    operator_spec,
)
from psychonauts.workspaces.repository import repo_local


def env_arguments(parser: CommandParser) -> None:
    """The `env` subcommand's own subcommands, on the parser of `repos env`."""
    sub = parser.add_subparsers(dest="env_command", required=True, metavar="ENV_COMMAND")
    build = sub.add_parser(
        "build",
        help="build the repository's environment at its target branch now (waits for it), or "
        "build an existing build ID again (a failed one too)",
    )
    build.add_argument("id", nargs="?", type=parse_id, help="an environment build's id")
    build.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one build (status, key, folder, error), or all builds")
    show.add_argument("id", nargs="?", type=parse_id)
    show.add_argument("--json", action="store_true")
    log = sub.add_parser("log", help="a build's setup log (redacted)")
    log.add_argument("id", type=parse_id)


def _data(build: EnvironmentBuild) -> dict[str, Any]:
    return {
        "id": build.pk,
        "status": build.status,
        "host": build.host,
        "key": build.key,
        "repository": build.repository,
        "commit": build.commit_sha,
        "error": build.error,
        "denied": build.denied,
        "size_bytes": build.size_bytes,
        "spec": build.spec,
        "started_at": build.started_at.isoformat() if build.started_at else None,
        "finished_at": build.finished_at.isoformat() if build.finished_at else None,
        "used_at": build.used_at.isoformat() if build.used_at else None,
    }


def env_handle(options: dict[str, Any], out: OutputWrapper) -> None:
    """Run `repos env <command>`; EnvironmentProblem (a PsychonautError) for the caller."""
    command = options["env_command"]
    if command == "build":
        if options.get("id"):
            environment = environment_rebuild(options["id"])
        else:
            found = environment_ensure(repo_local(), operator_spec())
            if found is None:
                out.write("the repository declares no environment (nothing to build)")
                return
            environment = found
        build = build_get(environment.build_id)
        if options.get("json"):
            emit_json(out, _data(build))
        else:
            out.write(f"environment {build.pk} ready: {environment.folder} (key {build.key[:12]})")
    elif command == "show":
        if options.get("id"):
            build = build_get(options["id"])
            if options.get("json"):
                emit_json(out, _data(build))
                return
            for name, value in _data(build).items():
                if value not in (None, "", []):
                    out.write(f"{name:12} {value}")
            return
        builds = list(EnvironmentBuild.objects.filter(host=host_name()))
        if options.get("json"):
            emit_json(out, [_data(b) for b in builds])
            return
        table(
            out,
            ["ID", "STATUS", "KEY", "COMMIT", "SIZE MB", "ERROR"],
            [
                [
                    b.pk,
                    b.status,
                    b.key[:12],
                    b.commit_sha[:12],
                    f"{(b.size_bytes or 0) / 2**20:.1f}",
                    shorten(b.error, 60),
                ]
                for b in builds
            ],
        )
    elif command == "log":
        build = build_get(options["id"])
        out.write(build.log or "(no output)")
