"""Shared pieces of the management commands: readable tables, --json output, id arguments."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from django.core.management.base import CommandParser, OutputWrapper
from django.core.serializers.json import DjangoJSONEncoder


def parse_id(value: str) -> int:
    """An id as typed by a human: `12`, `#12` or `q12`."""
    text = value.strip().lstrip("#").removeprefix("q").removeprefix("Q")
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not an id (a positive number)")
    return int(text)


def subcommands(parser: CommandParser) -> Callable[[str, str], CommandParser]:
    """Subcommands that each take --json: returns `add(name, help)` giving the subparser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def add(name: str, help_text: str) -> CommandParser:
        # parents= takes ArgumentParsers at runtime; the stubs ask for CommandParser.
        child: CommandParser = sub.add_parser(name, help=help_text, parents=[common])  # type: ignore[list-item]
        return child

    return add


def positive_int(value: str) -> int:
    """An argparse type: a count or limit, 1 or more."""
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return int(value)


def non_negative_int(value: str) -> int:
    """An argparse type: a count that may be 0 (none)."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of 0 or more")
    return int(value)


def emit_json(out: OutputWrapper, data: Any) -> None:
    out.write(json.dumps(data, cls=DjangoJSONEncoder, indent=2, sort_keys=False))


def table(out: OutputWrapper, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned table; `(none)` when empty."""
    if not rows:
        out.write("(none)")
        return
    cells = [[str(h) for h in headers]] + [
        ["" if c is None else str(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        out.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        if n == 0:
            out.write("  ".join("-" * width for width in widths))


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
