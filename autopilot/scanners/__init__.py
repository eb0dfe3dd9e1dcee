"""The deterministic scanners of the target repository: pure functions, a file's text (or a
command's output) in, findings out. Reading the repository and filing quanta is the service's
(`autopilot.services.scanners`).

A finding's fingerprint names it across passes: the scanner, the file, the rule and the
finding's key (its message with the numbers taken out, or what the scanner chose), never its
line, so code that moves keeps its fingerprint, and a fixed finding that comes back is the same
one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

# Folders whose files are someone else's code or generated: never scanned.
SKIP_DIRS: frozenset[str] = frozenset(
    {
        ".git", ".hg", ".svn", "node_modules", "bower_components", ".venv", "venv", "env",
        "site-packages", "vendor", "third_party", "third-party", "dist", "build", "_build",
        "__pycache__", ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".pytest_cache",
        "migrations", ".next", ".nuxt", "coverage", "htmlcov",
    }
)  # fmt: skip
# Files that are generated (lock files, minified bundles, source maps).
SKIP_SUFFIXES: tuple[str, ...] = (".min.js", ".min.css", ".map", ".lock", ".snap")
SKIP_NAMES: frozenset[str] = frozenset(
    {"package-lock.json", "pnpm-lock.yaml", "yarn.lock", "Cargo.lock", "poetry.lock", "uv.lock",
     "go.sum", "composer.lock", "Gemfile.lock"}
)  # fmt: skip
FILE_MAX_BYTES = 1_000_000  # a larger file is generated or data: not scanned
LINE_MAX_CHARS = 2_000  # a longer line is minified or data: not searched
MESSAGE_MAX_CHARS = 500
# git's own test for a binary file: a NUL byte in its first 8,000 bytes.
BINARY_PROBE_BYTES = 8_000

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NUMBER = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ScanFinding:
    """One thing a scanner found. `key` is what names it besides scanner, path and rule (the
    normalized message unless the scanner gives one); `evidence` is the text as it stands in the
    file, when a check can look for it."""

    scanner: str
    path: str
    line: int
    rule: str
    message: str
    key: str = ""
    evidence: str = ""

    def fingerprint(self, occurrence: int = 0) -> str:
        """sha256 of scanner, path, rule and key; `occurrence` tells apart identical findings
        of one file (the second `# TODO: test` of a file), in the order they appear."""
        key = self.key or normalize(self.message)
        parts = [self.scanner, self.path, self.rule, key]
        if occurrence:
            parts.append(str(occurrence))
        return hashlib.sha256("\x00".join(parts).encode("utf-8", "replace")).hexdigest()


def normalize(message: str) -> str:
    """A message as it names a finding: numbers out (counts, columns, line numbers in the text),
    spaces collapsed."""
    return _SPACE.sub(" ", _NUMBER.sub("#", message)).strip()


def clean_text(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """Text from a file or a command, safe to store and show: no control characters (tabs
    kept as spaces), no NUL, cut to `limit` characters."""
    text = _CONTROL.sub("", text.replace("\t", " ")).strip()
    # A lone surrogate cannot be stored (text decoded with errors="surrogateescape").
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def path_skipped(path: str) -> str:
    """Why a tracked file is not scanned by its name ("" when it is)."""
    parts = PurePosixPath(path).parts
    for part in parts[:-1]:
        if part in SKIP_DIRS:
            return "vendored"
    name = parts[-1] if parts else ""
    if name in SKIP_NAMES or name.endswith(SKIP_SUFFIXES):
        return "generated"
    return ""


def is_binary(data: bytes) -> bool:
    return b"\x00" in data[:BINARY_PROBE_BYTES]


def decode(data: bytes) -> str:
    """A file's text: invalid UTF-8 replaced, never an error."""
    return data.decode("utf-8", errors="replace")
