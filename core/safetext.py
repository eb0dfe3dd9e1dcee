"""Checks for text that came from outside (a file, a form, a socket, the command line).

Postgres refuses a NUL character in text, and a lone surrogate (what Python makes of bytes that
are not UTF-8 in a file name or an argument) cannot be encoded for it: either would fail deep in
a write, as a traceback. Callers check first and report the field; and an error message quotes
a value with `quoted`, so a hostile megabyte never travels back in the message.
"""

from __future__ import annotations

from typing import Any

QUOTE_MAX = 60  # characters of a value an error message repeats


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8"
    return None


def quoted(value: Any, limit: int = QUOTE_MAX) -> str:
    """repr() of `value`, cut to about `limit` characters: safe to print whatever it holds."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return repr(value[:limit]) + f"… ({len(value)} characters)"
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        text = repr(value)
        return text if len(text) <= limit + 2 else text[:limit] + "…"
    # A container may be huge or nested; its type and size say enough.
    size = f" of {len(value)}" if hasattr(value, "__len__") else ""
    return f"a {type(value).__name__}{size}"


def display_name(name: str) -> str:
    """A file name fit for a message and the database: undecodable bytes shown as U+FFFD."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no byte made
        raw = name.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace").replace("\x00", "\ufffd")
