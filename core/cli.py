"""Shared pieces of the management commands: readable tables, --json output, id arguments,
and `SafeCommand`, the base of every command: bad arguments are one line and exit 2."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import Any, TextIO, cast
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, OperationalError
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from core.redaction import redact
from core.safetext import quoted, text_problem

ID_MAX = 2**63 - 1  # ids are bigints
COUNT_MAX = 2**31 - 1  # counts and limits fit an integer column
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes "²" and "٣"

USAGE_ERROR = 2  # the exit status of a bad argument (argparse's); a refused action exits 1


# What a terminal acts on instead of showing: C0 controls but newline and tab (ESC starts CSI and
# OSC sequences: cursor moves, title changes, OSC 52 clipboard writes; CR and BS overwrite what
# is shown), DEL, C1 controls (CSI and OSC have one-character forms there), and the bidi
# controls that reorder what is shown (a line that reads differently from what it holds).
_TERMINAL_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def terminal_safe(text: str) -> str:
    """`text` fit for a terminal: each control character (escape sequences' introducers, C1,
    bidi overrides) shown as its escape (`\\x1b`, `\\u202e`), newlines and tabs kept. Every
    command's output goes through it; the operator sees what was there and the terminal acts on
    none of it."""
    return _TERMINAL_CONTROLS.sub(_visible, text)


class TerminalOutput(OutputWrapper):
    """A command's stdout or stderr: each message redacted and made terminal-safe before the
    command's style (its colours, the only escapes let through) is applied."""

    def write(  # type: ignore[override]  # OutputWrapper's own signature (see its stubs)
        self,
        msg: str = "",
        style_func: Callable[[str], str] | None = None,
        ending: str | None = None,
    ) -> None:
        super().write(terminal_safe(redact(msg)), style_func, ending)


class _RedactingStream:
    """A text stream whose every write is redacted first (the stream's other attributes, such
    as `isatty`, are the wrapped stream's)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._stream.write(redact(text)) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class SafeCommand(BaseCommand):
    """A management command whose bad input is one line on stderr, never a traceback, and
    whose output is redacted (core.redaction) and terminal-safe (`terminal_safe`) whatever it
    prints: `self.stdout` and `self.stderr` are always `TerminalOutput`s. A command applies its
    colours with `write(text, style_func)`, never by styling the text it passes.

    From a terminal an argument argparse refuses exits 2 with `prog: error: why` alone (no
    usage block), and so does a value no text column could store (a NUL, bytes that are not
    UTF-8): checked here for every command, before the command sees its options.
    """

    def __init__(self, stdout: Any = None, stderr: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(
            cast(TextIO, _RedactingStream(stdout or sys.stdout)),
            cast(TextIO, _RedactingStream(stderr or sys.stderr)),
            *args, **kwargs,
        )  # fmt: skip

    # Django assigns plain OutputWrappers in __init__ and execute: each becomes a TerminalOutput.
    @property
    def stdout(self) -> OutputWrapper:
        return self._terminal_stdout

    @stdout.setter
    def stdout(self, value: OutputWrapper) -> None:
        self._terminal_stdout = _terminal_output(value)

    @property
    def stderr(self) -> OutputWrapper:
        return self._terminal_stderr

    @stderr.setter
    def stderr(self, value: OutputWrapper) -> None:
        self._terminal_stderr = _terminal_output(value)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # A parser not "called from the command line" raises CommandError instead of printing
        # the usage and exiting; run_from_argv below prints it as one line.
        from_terminal = getattr(self, "_called_from_command_line", None)
        self._called_from_command_line = False
        try:
            parser = super().create_parser(prog_name, subcommand, **kwargs)
        finally:
            self._called_from_command_line = bool(from_terminal)
        self._prog = parser.prog
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        try:
            super().run_from_argv(argv)
        except CommandError as exc:  # only the parser's: Django reports the command's own
            message = str(exc).removeprefix("Error: ")
            self.stderr.write(f"{getattr(self, '_prog', argv[0])}: error: {message}")
            sys.exit(USAGE_ERROR)
        except BrokenPipeError:
            # The reader left (`... --json | head`): not an error of ours. Python would print a
            # traceback, and another when it flushes stdout at exit: point stdout at /dev/null
            # and exit as a process killed by SIGPIPE does.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(BROKEN_PIPE)

    # Commands that need no database set this False: the others check it answers first.
    needs_database = True
    # Commands that cannot do their work without Redis (the broker, the question queue) set
    # this True: they check it answers first, instead of retrying for minutes.
    needs_redis = False

    def execute(self, *args: Any, **options: Any) -> Any:
        for name, value in options.items():
            problem = _option_problem(value)
            if problem is not None:
                raise CommandError(f"{name}: {problem}", returncode=USAGE_ERROR)
        for stream in ("stdout", "stderr"):
            if options.get(stream) and not isinstance(options[stream], _RedactingStream):
                options[stream] = _RedactingStream(options[stream])
        if self.needs_database:
            problem = database_unreachable()
            if problem is not None:
                raise CommandError(problem)
        if self.needs_redis:
            problem = redis_unreachable()
            if problem is not None:
                raise CommandError(problem)
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            if not _connection_lost(exc):
                raise
            raise CommandError(
                f"the database stopped answering: {_first_line(exc)}. {DATABASE_HINT}"
            ) from None
        except (RedisConnectionError, KombuOperationalError) as exc:
            raise CommandError(f"cannot reach Redis: {_first_line(exc)}. {REDIS_HINT}") from None


BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader went away
PROBE_S = 2.0  # seconds to wait for a service's port before saying it is not there
DATABASE_HINT = "Start it (`scripts/services.sh start`, or `make dev`) or fix DATABASE_URL"
REDIS_HINT = "Start it (`scripts/services.sh start`, or `make dev`) or fix REDIS_URL"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _connection_lost(exc: DatabaseError) -> bool:
    # psycopg_pool's PoolTimeout and a server that went away are OperationalErrors; a bad
    # statement (ProgrammingError, IntegrityError ...) is a bug, and keeps its traceback.
    return isinstance(exc, OperationalError)


def _port_problem(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=PROBE_S).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def redis_unreachable() -> str | None:
    """Why Redis (REDIS_URL, and the Celery broker when it is elsewhere) does not answer, in one
    line, or None when it does."""
    urls = {str(settings.REDIS_URL), str(getattr(settings, "CELERY_BROKER_URL", ""))}
    for url in sorted(u for u in urls if u.startswith(("redis://", "rediss://"))):
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        reason = _port_problem(host, port)
        if reason is not None:
            name = "REDIS_URL" if url == str(settings.REDIS_URL) else "CELERY_BROKER_URL"
            return f"cannot reach Redis at {host}:{port} ({name}): {reason}. {REDIS_HINT}"
    return None


def database_unreachable() -> str | None:
    """Why the database's port does not answer, in one line, or None when it does. A TCP
    connect costs well under a millisecond on loopback; without it a command waits for the
    connection pool's timeout (30 s) before failing with a traceback."""
    db = settings.DATABASES["default"]
    host = str(db.get("HOST") or "")
    if not host or host.startswith("/"):
        return None  # a unix socket: the driver's own error is quick and clear
    port = int(db.get("PORT") or 5432)
    reason = _port_problem(host, port)
    if reason is None:
        return None
    name = db.get("NAME") or "?"
    return (
        f"cannot reach the database {name} at {host}:{port} (DATABASE_URL): {reason}. "
        f"{DATABASE_HINT}"
    )


def _terminal_output(wrapper: OutputWrapper) -> OutputWrapper:
    if isinstance(wrapper, TerminalOutput):
        return wrapper
    out = TerminalOutput(cast(TextIO, wrapper._out), wrapper.ending)
    if wrapper.style_func is not None:
        out.style_func = wrapper.style_func
    return out


def _option_problem(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        return next((p for p in map(_option_problem, value) if p is not None), None)
    if isinstance(value, PurePath):
        # A file name may hold any bytes but NUL (the file system takes them).
        return "contains a NUL character" if "\x00" in str(value) else None
    if isinstance(value, str):
        return text_problem(value)
    return None


def parse_id(value: str) -> int:
    """An id as typed by a human: `12`, `#12` or `q12`."""
    text = value.strip().lstrip("#").removeprefix("q").removeprefix("Q")
    if not _DIGITS.fullmatch(text) or not 0 < int(text) <= ID_MAX:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not an id (a positive number)")
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
    if not _DIGITS.fullmatch(value) or not 0 < int(value) <= COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not a positive number")
    return int(value)


def non_negative_int(value: str) -> int:
    """An argparse type: a count that may be 0 (none)."""
    if not _DIGITS.fullmatch(value) or int(value) > COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not a number of 0 or more")
    return int(value)


def seconds(value: str) -> float:
    """An argparse type: a duration in seconds, more than 0 and finite."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not a number of seconds")
    return number


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
