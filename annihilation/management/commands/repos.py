"""`manage.py repos ...`: the registry of repositories, each subcommand with --json.

    list | show NAME | add NAME LOCATION [--branch B] [--verify CMD]... [--environment FILE] |
    set NAME [--branch B] [--verify CMD]... [--environment FILE] | remove NAME |
    env build [ID] | env show [ID] | env log ID   (the default repository's environment builds)

Exit status: 0 done, 1 refused (unknown name, not a git repository, open quanta ...), 2 bad usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand, emit_json, shorten, subcommands, table
from core.safeyaml import InputRefused, read_text
from psychonauts.environments.cli import env_arguments, env_handle
from psychonauts.errors import PsychonautError
from psychonauts.workspaces.registration import repository_inspect
from repos.errors import RepositoryError
from repos.models import Repository
from repos.selectors import repositories_list, repository_get
from repos.services import (
    repository_as_data,
    repository_create,
    repository_default,
    repository_remove,
    repository_update,
)


def _environment(path: str | None) -> str | None:
    """The declaration file's text ("-" is none: clears it); None when not given."""
    if path is None:
        return None
    if path == "-":
        return ""
    try:
        return read_text(Path(path))
    except (InputRefused, OSError) as exc:
        raise CommandError(f"{path}: {exc}") from None


def _open(repository: Repository) -> int:
    """Its open quanta, as repositories_list() counted them."""
    return int(getattr(repository, "open_quanta", 0))


class Command(SafeCommand):
    help = "Register, show and remove the repositories agents work on."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        add("list", "registered repositories, the default first")
        add("show", "one repository").add_argument("name")
        p = add("add", "register a repository (its location must be a git repository)")
        p.add_argument("name")
        p.add_argument("location", help="a local repository's path, or a central repository URL")
        self._fields(p)
        p = add("set", "change a repository's branch, verify commands or environment")
        p.add_argument("name")
        self._fields(p)
        add("remove", "remove a repository without open work (its history stays)").add_argument(
            "name"
        )
        env_arguments(add("env", "the environment builds: build | show | log"))

    @staticmethod
    def _fields(p: CommandParser) -> None:
        p.add_argument("--branch", help="the target branch (default: the one checked out)")
        p.add_argument(
            "--verify", action="append", metavar="CMD", help="a default verify command (repeat)"
        )
        p.add_argument(
            "--environment", metavar="FILE", help="the environment declaration (YAML or JSON)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        repository_default()  # ANNIHILATION_REPO is always listed
        try:
            getattr(self, "do_" + options["subcommand"])(options)
        except (RepositoryError, PsychonautError) as exc:
            raise CommandError(str(exc)) from None

    def say(self, data: Any, text: str) -> None:
        if self.as_json:
            emit_json(self.stdout, data)
        else:
            self.stdout.write(text)

    def do_list(self, options: dict[str, Any]) -> None:
        rows = list(repositories_list())
        if self.as_json:
            emit_json(
                self.stdout,
                [{**repository_as_data(r), "open_quanta": _open(r)} for r in rows],
            )
            return
        data = [repository_as_data(r) for r in rows]
        table(
            self.stdout,
            ["NAME", "LOCATION", "BRANCH", "OPEN", "DEFAULT"],
            [
                [
                    d["name"],
                    shorten(d["location"], 60),
                    d["target_branch"] or "(checked out)",
                    _open(r),
                    "yes" if d["is_default"] else "",
                ]
                for d, r in zip(data, rows, strict=True)
            ],
        )

    def do_show(self, options: dict[str, Any]) -> None:
        data = repository_as_data(repository_get(name=options["name"]))
        lines = [
            f"{data['name']} (#{data['id']}){' default' if data['is_default'] else ''}",
            f"  location:    {data['location']}",
            f"  branch:      {data['target_branch'] or '(the one checked out)'}",
            "  verify:      " + (" ||| ".join(data["verify_commands"]) or "(none)"),
            "  environment: " + ("(none)" if not data["environment"] else ""),
            *(f"    {line}" for line in data["environment"].splitlines()),
        ]
        self.say(data, "\n".join(lines))

    def do_add(self, options: dict[str, Any]) -> None:
        repository = repository_create(
            name=options["name"],
            location=options["location"],
            target_branch=options["branch"] or "",
            verify_commands=options["verify"] or [],
            environment=_environment(options["environment"]) or "",
            inspect=repository_inspect,
        )
        self.say(repository_as_data(repository), f"added repository {repository.name}")

    def do_set(self, options: dict[str, Any]) -> None:
        repository = repository_update(
            name=options["name"],
            target_branch=options["branch"],
            verify_commands=options["verify"],
            environment=_environment(options["environment"]),
            inspect=repository_inspect,
        )
        self.say(repository_as_data(repository), f"updated repository {repository.name}")

    def do_env(self, options: dict[str, Any]) -> None:
        env_handle(options, self.stdout)

    def do_remove(self, options: dict[str, Any]) -> None:
        repository = repository_remove(name=options["name"])
        self.say(repository_as_data(repository), f"removed repository {repository.name}")
