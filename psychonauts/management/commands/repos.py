"""`manage.py repos env build|show|log`: the repository's environment (psychonauts/environments)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand
from psychonauts.environments.cli import env_arguments, env_handle
from psychonauts.errors import PsychonautError


class Command(SafeCommand):
    help = "Repositories: their environments (env build|show|log)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        env_arguments(sub.add_parser("env", help="the repository's environment builds"))

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            env_handle(options, self.stdout)
        except PsychonautError as exc:
            raise CommandError(str(exc)) from None
