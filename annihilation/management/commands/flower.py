"""`manage.py flower`: Celery's Flower, never without a password.

Flower can shut workers down and revoke tasks, so it starts only with basic-auth credentials:
ANNIHILATION_FLOWER_USER and ANNIHILATION_FLOWER_PASSWORD, or Flower's own FLOWER_BASIC_AUTH
(user:password). They reach Flower through its environment, not its command line, which any
user of the machine can read with ps.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

NO_CREDENTIALS = (
    "Flower needs credentials: set ANNIHILATION_FLOWER_USER and ANNIHILATION_FLOWER_PASSWORD "
    "(or FLOWER_BASIC_AUTH=user:password)"
)


def flower_basic_auth() -> str:
    """The `user:password` Flower is given, from the settings or FLOWER_BASIC_AUTH."""
    user, password = settings.FLOWER_USER, settings.FLOWER_PASSWORD
    if not user and not password:
        pairs = settings.FLOWER_BASIC_AUTH
        if not pairs:
            raise CommandError(NO_CREDENTIALS, returncode=2)
        # Flower's own format, possibly several comma-separated pairs: each must have both parts.
        if not all(
            name and secret for name, _, secret in (p.partition(":") for p in pairs.split(","))
        ):
            raise CommandError(
                "FLOWER_BASIC_AUTH must be user:password[,user:password]", returncode=2
            )
        return pairs
    if not user or not password:
        raise CommandError(NO_CREDENTIALS, returncode=2)
    # Flower splits its option on commas, and compares credentials as ASCII.
    if ":" in user or "," in user or "," in password or not (user + password).isascii():
        raise CommandError(
            "ANNIHILATION_FLOWER_USER and ANNIHILATION_FLOWER_PASSWORD must be ASCII without ',' "
            "(and the user without ':')",
            returncode=2,
        )
    return f"{user}:{password}"


class Command(BaseCommand):
    help = "Start Flower (Celery's monitor) with basic auth; refuses to start without credentials."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=5555)
        parser.add_argument("--address", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        env = {**os.environ, "FLOWER_BASIC_AUTH": flower_basic_auth()}
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "annihilation",
            "flower",
            f"--port={options['port']}",
            f"--address={options['address']}",
        ]
        sys.stdout.flush()
        sys.stderr.flush()
        # Replaces this process: a supervisor's signals reach Flower itself.
        os.execve(sys.executable, argv, env)
