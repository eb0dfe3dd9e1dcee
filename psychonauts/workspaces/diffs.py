"""Unified diffs (`git diff` output) read per file, each line tagged for colouring.

The Focus page shows a quantum's worktree diff with it, the change page of the Tether a
reviewed change's diff; both go through `diff_parse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

LineTag = Literal["add", "del", "hunk", "ctx"]

_TAGS: dict[str, LineTag] = {"+": "add", "-": "del", "@": "hunk"}
_FILE_HEADER = "diff --git "
# Header lines that say nothing the file's title does not (the paths, the blob ids). Only
# before a file's first hunk: inside one, `--- x` is a removed line that starts with `-- `.
_SKIPPED = ("index ", "--- ", "+++ ")


class DiffLine(TypedDict):
    tag: LineTag
    text: str


def diff_line(line: str) -> DiffLine:
    """One line of a diff with its tag: add, del, hunk (`@@ ... @@`) or ctx (anything else)."""
    return {"tag": _TAGS.get(line[:1], "ctx"), "text": line}


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a diff."""

    path: str  # the b/ side of its `diff --git a/... b/...` line
    text: str  # its part of the diff as it was, from that line on (trailing newlines cut)
    lines: list[DiffLine]  # what is shown: every line after the header but index/---/+++
    additions: int
    deletions: int


def diff_parse(diff: str) -> list[FilePatch]:
    """The diff split per file, in its order; text before the first file header is ignored."""
    files: list[FilePatch] = []
    path = ""
    raw: list[str] = []
    lines: list[DiffLine] = []
    in_hunk = False

    def close() -> None:
        if raw:
            files.append(
                FilePatch(
                    path=path,
                    text="".join(raw).rstrip("\n"),
                    lines=lines,
                    additions=sum(line["tag"] == "add" for line in lines),
                    deletions=sum(line["tag"] == "del" for line in lines),
                )
            )

    for kept in diff.splitlines(keepends=True):
        line = kept.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        if line.startswith(_FILE_HEADER):
            close()
            path, raw, lines, in_hunk = line.split(" b/", 1)[-1], [kept], [], False
            continue
        if not raw:
            continue
        raw.append(kept)
        in_hunk = in_hunk or line.startswith("@@")
        if in_hunk or not line.startswith(_SKIPPED):
            lines.append(diff_line(line))
    close()
    return files


def diff_by_path(diff: str) -> dict[str, FilePatch]:
    """`diff_parse` keyed by path (a path listed twice: its last part)."""
    return {patch.path: patch for patch in diff_parse(diff)}
