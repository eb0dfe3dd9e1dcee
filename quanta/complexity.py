"""A quantum's complexity, guessed from its text when the operator does not set it.

Pure and deterministic: the same title and body always give the same `Classification`, with
the reasons shown to the operator ("standard (auto: 48 words; names 2 files)").

- `complex`: the prose names an overriding keyword (refactor, migration, security, ...), or it
  is long, or it names many files.
- `trivial`: short prose, at most one file, at most `MAX_STEPS` steps, and either the steps are
  mechanical or the prose names a trivial keyword (typo, rename, bump, ...).
- `standard`: everything else.

The body is *mechanical* when it gives its steps as shell commands (lines starting with `$ `,
or a fenced ```sh / ```bash / ```shell block) and little else: at most `MECHANICAL_PROSE_WORDS`
words of prose around them and no other code block. Such a trivial quantum runs without a model
(the agent runtime's `shell` provider runs the steps). Keywords and files are looked for in the
title and the prose, not in the commands: `$ python manage.py migrate` is not a migration to
design.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quanta.models import Complexity

# Whole words, case-insensitive, in the title and the prose.
COMPLEX_KEYWORDS = frozenset(
    {
        "architecture", "architectural", "auth", "authentication", "authorization", "oauth",
        "concurrency", "concurrent", "crypto", "cryptography", "deadlock", "distributed",
        "encryption", "injection", "migrate", "migrating", "migration", "migrations",
        "performance", "permissions", "race", "redesign", "refactor", "refactoring",
        "rewrite", "scalability", "security", "vulnerability", "xss", "csrf",
    }
)  # fmt: skip
TRIVIAL_KEYWORDS = frozenset(
    {
        "typo", "typos", "rename", "bump", "format", "formatting", "reword", "spelling",
        "whitespace", "wording", "comment", "docstring", "changelog", "lint", "indentation",
    }
)  # fmt: skip

TRIVIAL_MAX_WORDS = 60  # words of title and prose
TRIVIAL_MAX_FILES = 1
COMPLEX_MIN_WORDS = 400
COMPLEX_MIN_FILES = 6
MAX_STEPS = 20  # more than this is not a trivial job, whatever the steps are
STEP_MAX_CHARS = 2000  # one command (as a verify command)
MECHANICAL_PROSE_WORDS = 30  # "Run these:" and a line of why, not a description of work
SCAN_MAX_CHARS = 200_000  # a longer text is complex by its length; the rest is not read

_WORD = re.compile(r"[a-z][a-z0-9_'-]*")  # of the lowercased text
# A path: a name with an extension (`README.md`, `src/app.py`) or with a slash (`docs/`),
# matched against one whitespace-separated token at a time (no nested repetition: linear time).
_PATH_EXT = re.compile(r"[\w./-]*\.[A-Za-z][A-Za-z0-9]{0,7}")
_PATH_DIR = re.compile(r"\.{0,2}[\w.-]*/[\w./-]*")
# Words joined by slashes are prose ("and/or", "add/list/complete"), not a folder.
_ALTERNATIVES = re.compile(r"[A-Za-z]+(?:/[A-Za-z]+)+")
_PATH_MAX = 300  # a longer token is not a file name
# Whole tokens with a dot or a slash; each is tried from its start only (linear time).
_CANDIDATE = re.compile(r"(?<!\S)\S*[./]\S*")
_TRIM = "\"'`()[]{}<>,;:!?*"
_NOT_PATHS = frozenset({"e.g", "i.e", "vs", "etc"})
_FENCE = re.compile(r"^\s*```\s*([A-Za-z0-9_+-]*)\s*$")
_SHELL_FENCES = frozenset({"sh", "bash", "shell", "console", "zsh"})


@dataclass(frozen=True)
class Classification:
    complexity: str
    mechanical: bool
    steps: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def summary(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class _Parts:
    prose: str
    steps: tuple[str, ...]
    other_code: bool  # a fenced block that is not shell (or one left open)


def _split(body: str) -> _Parts:
    """The body's prose, its shell steps, and whether it holds other code."""
    prose: list[str] = []
    steps: list[str] = []
    other_code = False
    fence: str | None = None  # the open fence's language
    block: list[str] = []
    for line in body.splitlines():
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence, block = opened.group(1).lower(), []
            continue
        if fence is not None:
            if line.strip() == "```":
                if fence in _SHELL_FENCES:
                    steps.extend(_commands(block))
                else:
                    other_code = True
                fence = None
            else:
                block.append(line)
            continue
        stripped = line.strip()
        if stripped.startswith("$ ") and stripped[2:].strip():
            steps.append(stripped[2:].strip())
        else:
            prose.append(line)
    if fence is not None:  # never closed: not steps anyone can trust to run
        other_code = True
        prose.extend(block)
    return _Parts("\n".join(prose), tuple(steps), other_code)


def _commands(block: list[str]) -> list[str]:
    """A shell block's commands: one a line (a trailing backslash continues it), `$ ` prompts
    dropped, blank lines and comments skipped."""
    commands: list[str] = []
    pending = ""
    for raw in block:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending and line.startswith("$ "):
            line = line[2:].strip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command:
            commands.append(command)
    if pending.strip():
        commands.append(pending.strip())
    return commands


def _files(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for raw in _CANDIDATE.findall(text):
        token = raw.strip(_TRIM).rstrip(".")
        if not token or len(token) > _PATH_MAX or "://" in raw or token.lower() in _NOT_PATHS:
            continue
        if not any(c.isalpha() for c in token):
            continue
        if _PATH_EXT.fullmatch(token) or (
            _PATH_DIR.fullmatch(token) and not _ALTERNATIVES.fullmatch(token)
        ):
            seen.setdefault(token, None)
    return list(seen)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def complexity_classify(title: str, body: str = "") -> Classification:
    """The complexity the quantum's text suggests, whether its steps are mechanical (and which),
    and why."""
    title, body = title[:SCAN_MAX_CHARS], body[:SCAN_MAX_CHARS]
    parts = _split(body)
    prose = f"{title}\n{parts.prose}"
    words = prose.split()
    vocabulary = set(_WORD.findall(prose.lower()))
    files = _files(prose)
    reasons = [_plural(len(words), "word")]
    if files:
        shown = ", ".join(files[:3]) + (", …" if len(files) > 3 else "")
        reasons.append(f"names {_plural(len(files), 'file')} ({shown})")

    steps = parts.steps
    prose_words = len(parts.prose.split())
    mechanical = False
    if steps:
        if parts.other_code:
            reasons.append("steps given, but with other code: not mechanical")
        elif prose_words > MECHANICAL_PROSE_WORDS:
            reasons.append(f"steps given, but with {prose_words} words of prose: not mechanical")
        elif len(steps) > MAX_STEPS:
            reasons.append(f"{len(steps)} steps (more than {MAX_STEPS}): not mechanical")
        elif any(len(s) > STEP_MAX_CHARS for s in steps):
            reasons.append(f"a step longer than {STEP_MAX_CHARS} characters: not mechanical")
        else:
            mechanical = True
            reasons.append(f"{_plural(len(steps), 'step')} given as shell commands")
    if not mechanical:
        steps = ()

    overrides = sorted(vocabulary & COMPLEX_KEYWORDS)
    if overrides:
        reasons.append("names " + ", ".join(repr(k) for k in overrides[:3]))
        return Classification(Complexity.COMPLEX, mechanical, steps, tuple(reasons))
    if len(words) >= COMPLEX_MIN_WORDS:
        reasons.append(f"long (at least {COMPLEX_MIN_WORDS} words)")
        return Classification(Complexity.COMPLEX, mechanical, steps, tuple(reasons))
    if len(files) >= COMPLEX_MIN_FILES:
        reasons.append(f"many files (at least {COMPLEX_MIN_FILES})")
        return Classification(Complexity.COMPLEX, mechanical, steps, tuple(reasons))

    trivial_words = sorted(vocabulary & TRIVIAL_KEYWORDS)
    if trivial_words:
        reasons.append("names " + ", ".join(repr(k) for k in trivial_words[:3]))
    if len(words) > TRIVIAL_MAX_WORDS:
        reasons.append(f"more than {TRIVIAL_MAX_WORDS} words: not trivial")
    elif len(parts.steps) > MAX_STEPS:
        reasons.append(f"more than {MAX_STEPS} steps: not trivial")
    elif len(files) > TRIVIAL_MAX_FILES:
        reasons.append(f"more than {_plural(TRIVIAL_MAX_FILES, 'file')}: not trivial")
    elif mechanical or trivial_words:
        return Classification(Complexity.TRIVIAL, mechanical, steps, tuple(reasons))
    else:
        reasons.append("no trivial keyword and no mechanical steps")
    return Classification(Complexity.STANDARD, mechanical, steps, tuple(reasons))
