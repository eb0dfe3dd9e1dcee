"""TODO, FIXME, XXX and HACK in comments: one finding per comment (rule `todo`).

A marker counts only right after a comment's opening (`#`, `//`, `/*`, `<!--`, `--`, `;`, or
`*` opening a line inside a block comment), in capitals: "the TODO list" in prose or a name
such as `todo_items` is not one. In Python files only real comments count (the tokenizer says
which; a file it cannot read falls back to the line-by-line search): `"# TODO"` inside a string
is not a comment.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import PurePosixPath

from autopilot.scanners import LINE_MAX_CHARS, ScanFinding, clean_text

SCANNER = "todo"
RULE = "todo"
MARKERS = ("TODO", "FIXME", "XXX", "HACK")
EVIDENCE_MAX = 200

_COMMENTED = re.compile(
    r"(?:^\s*\*|^\s*;+|(?:^|\s)(?:#+|//+|/\*+|<!--|--))[ \t]*"
    r"(?P<tag>TODO|FIXME|XXX|HACK)\b(?P<rest>.*)"
)
_CLOSERS = re.compile(r"\s*(?:\*+/|-->)\s*$")
_LEAD = re.compile(r"^(?:\([^)]{0,60}\))?[\s:.,-]*")


def todo_scan(path: str, text: str) -> list[ScanFinding]:
    """The marked comments of one file, in order."""
    if not any(marker in text for marker in MARKERS):
        return []
    lines = text.splitlines()
    comments = _python_comments(text) if PurePosixPath(path).suffix in (".py", ".pyi") else None
    found: list[ScanFinding] = []
    for number, line in enumerate(lines, start=1):
        if len(line) > LINE_MAX_CHARS:
            continue
        if comments is not None:
            if number not in comments:
                continue
            line = line[comments[number] :]  # the comment itself
        match = _COMMENTED.search(line)
        if match is None:
            continue
        found.append(_finding(path, number, line, match))
    return found


def _finding(path: str, number: int, line: str, match: re.Match[str]) -> ScanFinding:
    tag = match.group("tag")
    rest = _LEAD.sub("", _CLOSERS.sub("", match.group("rest"))).strip()
    message = clean_text(f"{tag}: {rest}" if rest else tag)
    # What a check may grep for: the comment from its marker on, as it stands in the file.
    evidence = _CLOSERS.sub("", line[match.start("tag") :]).rstrip()
    return ScanFinding(
        scanner=SCANNER,
        path=path,
        line=number,
        rule=RULE,
        message=message,
        evidence=evidence if len(evidence) <= EVIDENCE_MAX else "",
    )


def _python_comments(text: str) -> dict[int, int] | None:
    """Line -> column of the comment on it, for a Python file; None when it does not tokenize."""
    comments: dict[int, int] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.start[1]
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return comments
