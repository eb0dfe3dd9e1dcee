"""A linter's output read as findings: lines `path:line[:col]: message` (ruff's concise format,
flake8, pylint's parseable format, mypy, eslint's unix format, gcc and clang ...).

The rule is the code the message names: a leading code (`F401`, `E501`, `C0114`), else a
trailing bracketed one (`[no-unused-vars]` of eslint's `[Error/no-unused-vars]`, mypy's
`[attr-defined]`, gcc's `[-Wunused-variable]`), else `lint`. Only files of the scanned tree
count (a path outside it is the linter's own noise); gcc's `note:` lines are not findings.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from autopilot.scanners import ScanFinding, clean_text

SCANNER = "lint"
OUTPUT_LINES_MAX = 20_000  # lines of output read
LINE_MAX_CHARS = 4_000

_LINE = re.compile(
    r"^(?P<path>[^\s:][^:]*?):(?P<line>\d{1,9})(?::(?P<col>\d{1,9}))?:\s*(?P<msg>.*\S)"
)
_SEVERITY = re.compile(r"^(?:(?:error|warning|warn|info|style|convention)\s*:\s*)", re.I)
_LEADING_CODE = re.compile(r"^(?P<code>[A-Z]{1,5}\d{2,6})\b\s*(?:\[\*\]\s*)?(?P<rest>.*)$")
_TRAILING_CODE = re.compile(r"\s*\[(?P<code>[^\[\]\s]{1,100})\]\s*$")


def lint_parse(output: str, *, paths: Collection[str], root: str = "") -> list[ScanFinding]:
    """The findings in a linter's output about files in `paths` (paths relative to the tree;
    `root`, the tree's folder, is taken off absolute paths)."""
    found: list[ScanFinding] = []
    prefix = root.rstrip("/") + "/" if root else ""
    for raw in output.splitlines()[:OUTPUT_LINES_MAX]:
        if len(raw) > LINE_MAX_CHARS:
            continue
        match = _LINE.match(raw.strip())
        if match is None:
            continue
        path = match.group("path")
        if prefix and path.startswith(prefix):
            path = path[len(prefix) :]
        path = path.removeprefix("./")
        if path not in paths:
            continue
        message = _SEVERITY.sub("", match.group("msg"))
        if message.lower().startswith("note:"):
            continue
        rule, message = _rule(message)
        message = clean_text(message)
        if not message:
            continue
        found.append(
            ScanFinding(
                scanner=SCANNER, path=path, line=int(match.group("line")), rule=rule,
                message=message,
            )
        )  # fmt: skip
    return found


def _rule(message: str) -> tuple[str, str]:
    leading = _LEADING_CODE.match(message)
    if leading is not None:
        return leading.group("code"), leading.group("rest") or message
    trailing = _TRAILING_CODE.search(message)
    if trailing is not None:
        code = trailing.group("code")
        # eslint's unix format: `[Error/rule-id]`.
        if "/" in code and code.split("/", 1)[0] in {"Error", "Warning"}:
            code = code.split("/", 1)[1]
        return clean_text(code, 200), message[: trailing.start()]
    return "lint", message
