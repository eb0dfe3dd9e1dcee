"""`manage.py tokens ...`: the API's client tokens, each subcommand with --json.

    create NAME [--scope read|operate]... | list [--all] | revoke ID

`create` prints the token once: only its hash is kept. Exit status: 0 done, 1 refused (unknown
id, already revoked, a bad name), 2 bad usage.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from api.errors import ApiError
from api.models import ApiToken, TokenScope
from api.selectors import tokens_list
from api.services import token_create, token_revoke
from core.cli import SafeCommand, emit_json, parse_id, shorten, subcommands, table


def token_data(t: ApiToken) -> dict[str, Any]:
    return {
        "id": t.pk,
        "name": t.name,
        "prefix": f"ann_{t.prefix}_",
        "scopes": t.scopes,
        "created_by": t.created_by,
        "created_at": t.created_at.isoformat(),
        "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
        "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
    }


class Command(SafeCommand):
    help = "Create, list and revoke API tokens. Each takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        p = add("create", "a new token for a client; printed once")
        p.add_argument("name", help="which client it is for")
        p.add_argument(
            "--scope",
            action="append",
            dest="scopes",
            choices=TokenScope.values,
            help="read (default) and/or operate (repeatable)",
        )
        p = add("list", "active tokens (--all: revoked too)")
        p.add_argument("--all", action="store_true")
        add("revoke", "revoke a token: its next request is refused").add_argument(
            "id", type=parse_id
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        try:
            getattr(self, "do_" + options["subcommand"])(options)
        except ApiError as exc:
            raise CommandError(str(exc)) from None

    def _write_secret(self, text: str) -> None:
        # The one place a whole token is printed: past the redacting stream on purpose (the
        # token may look like a secret to it, and the operator needs it verbatim).
        out: Any = self.stdout._out  # the OutputWrapper's stream: the redacting wrapper
        raw: Any = getattr(out, "_stream", out)
        raw.write(text + "\n")
        raw.flush()

    def do_create(self, options: dict[str, Any]) -> None:
        made = token_create(
            name=options["name"],
            scopes=options["scopes"] or [TokenScope.READ],
            by=getpass.getuser() or "operator",
        )
        if self.as_json:
            self._write_secret(
                json.dumps({**token_data(made.token), "token": made.secret}, indent=2)
            )
            return
        self.stdout.write(
            f"token {made.token.pk} for {made.token.name} ({', '.join(made.token.scopes)})."
            " Copy it now, it is not shown again:"
        )
        self._write_secret(made.secret)

    def do_list(self, options: dict[str, Any]) -> None:
        rows = tokens_list(include_revoked=options["all"])
        if self.as_json:
            emit_json(self.stdout, [token_data(t) for t in rows])
            return
        table(
            self.stdout,
            ["id", "name", "scopes", "prefix", "last used", "revoked"],
            [
                (
                    t.pk,
                    shorten(t.name, 40),
                    ",".join(t.scopes),
                    f"ann_{t.prefix}_",
                    t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "-",
                    t.revoked_at.strftime("%Y-%m-%d %H:%M") if t.revoked_at else "-",
                )
                for t in rows
            ],
        )

    def do_revoke(self, options: dict[str, Any]) -> None:
        token = token_revoke(token_id=options["id"], by=getpass.getuser() or "operator")
        if self.as_json:
            emit_json(self.stdout, token_data(token))
        else:
            self.stdout.write(f"token {token.pk} ({token.name}) revoked")
