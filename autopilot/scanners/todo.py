"""TODO, FIXME, XXX and HACK in comments: one finding per comment (rule `todo`).

A marker counts only right after a comment's opening (`#`, `//`, `/*`, `<!--`, `--`, `;`, or
`*` opening a line inside a block comment), in capitals: "the TODO list" in prose or a name
such as `todo_items` is not one.
"""

from __future__ import annotations

import re

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
    found: list[ScanFinding] = []
    if not any(marker in text for marker in MARKERS):
        return found
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) > LINE_MAX_CHARS:
            continue
        match = _COMMENTED.search(line)
        if match is None:
            continue
        tag = match.group("tag")
        rest = _LEAD.sub("", _CLOSERS.sub("", match.group("rest"))).strip()
        message = clean_text(f"{tag}: {rest}" if rest else tag)
        # What a check may grep for: the comment from its marker on, as it stands in the file.
        evidence = _CLOSERS.sub("", line[match.start("tag") :]).rstrip()
        found.append(
            ScanFinding(
                scanner=SCANNER,
                path=path,
                line=number,
                rule=RULE,
                message=message,
                evidence=evidence if len(evidence) <= EVIDENCE_MAX else "",
            )
        )
    return found
