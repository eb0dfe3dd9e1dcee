"""The maintained rule set under core.redaction: gitleaks' default configuration.

`core/vendor/gitleaks/gitleaks.toml` is gitleaks' published `config/gitleaks.toml` (MIT licence
beside it; commit b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b of github.com/gitleaks/gitleaks,
v8.25+ format), kept as it is published: to update it, replace the file and run
tests/core/test_redaction.py. About 220 rules, one per provider's token format, each with
the lower-case keywords one of which occurs wherever it matches, a minimum Shannon entropy for
the secret, and allow-lists (values that are known examples or placeholders).

Read as gitleaks reads it: the secret is the rule's `secretGroup`, or its first non-empty group,
or the whole match; a secret at or under the rule's entropy, or matched by a global or the
rule's allow-list (regexes on the secret, the match or the line; stop words in the secret) is
not one. What gitleaks keys on a file's path (path-only rules, allow-lists of paths) does not
apply to text that has no path and is left out.

Go's RE2 syntax is translated where Python's differs: a flag group such as `(?i)` in the middle
of a pattern (Go applies it to the rest of its group; Python only takes it at the start) becomes
a scoped group, `\\z` becomes `\\Z`, and a `[` inside a character class is escaped.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "vendor" / "gitleaks" / "gitleaks.toml"

# Rules left out: their matches are this project's own business or too broad for prose. The
# generic assignment rule (`key = value` with high entropy) is core.redaction's own keyword
# rule, which knows code from literals; gitleaks' would blank identifiers in ordinary code.
SKIPPED = frozenset({"generic-api-key"})


@dataclass(frozen=True)
class Allowlist:
    regexes: tuple[re.Pattern[str], ...]
    target: str  # "secret", "match" or "line"
    stopwords: tuple[str, ...]

    def allows(self, secret: str, match: str, line: str) -> bool:
        value = {"match": match, "line": line}.get(self.target, secret)
        if any(r.search(value) for r in self.regexes):
            return True
        lowered = secret.lower()
        return any(word in lowered for word in self.stopwords)


@dataclass(frozen=True)
class GitleaksRule:
    id: str
    published: str  # the pattern in Go's syntax, translated and compiled on first use
    keywords: tuple[str, ...]
    entropy: float
    secret_group: int
    allowlists: tuple[Allowlist, ...]

    # Translated and compiled when a text first holds one of the rule's keywords: a process
    # pays only for the rules its texts call for, not for some 200 at its first redaction.
    @cached_property
    def _python(self) -> tuple[str, bool]:
        return _fast(go_regex(self.published))

    @property
    def source(self) -> str:
        """The pattern in Python's syntax, without its costly beginning (`_fast`)."""
        return self._python[0]

    @property
    def word_start(self) -> bool:
        """The published pattern began with `\\b` (checked in `matches`)."""
        return self._python[1]

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.source)

    def matches(self, text: str) -> Iterator[re.Match[str]]:
        """The pattern's matches, leftmost first, as the published pattern finds them."""
        if not self.word_start:
            yield from self.pattern.finditer(text)
            return
        at = 0
        while (match := self.pattern.search(text, at)) is not None:
            start = match.start()
            before = start > 0 and _word_char(text[start - 1])
            if before != (start < len(text) and _word_char(text[start])):
                yield match
                at = max(match.end(), start + 1)
            else:
                at = start + 1

    def secret_span(self, match: re.Match[str]) -> tuple[int, int]:
        """Where the secret is in the match, as gitleaks picks it."""
        if self.secret_group and match.re.groups >= self.secret_group:
            return match.span(self.secret_group)
        for group in range(1, match.re.groups + 1):
            start, end = match.span(group)
            if end > start:
                return start, end
        return match.span()


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


# What the published patterns begin with that costs Python's engine most and changes no secret:
# a leading `\b` (the engine then cannot skip ahead to a literal: checked after each match
# instead) and a leading lazy `[\w.-]{0,50}?` before the provider's name (tried at every
# position; the secret is the same without it, and only the match's start moves).
_LEADING_FLAGS = re.compile(r"\(\?[a-z]+\)")
_LAZY_PREFIX = r"[\w.-]{0,50}?"


def _fast(pattern: str) -> tuple[str, bool]:
    """(the pattern without its costly beginning, whether it began with `\b`)."""
    flags = _LEADING_FLAGS.match(pattern)
    head = flags.group() if flags else ""
    rest = pattern[len(head) :]
    if rest.startswith(_LAZY_PREFIX):
        rest = rest[len(_LAZY_PREFIX) :]
    if rest.startswith("\\b"):
        return head + rest[2:], True
    return head + rest, False


def entropy(text: str) -> float:
    """Shannon entropy in bits per character, as gitleaks computes it."""
    if not text:
        return 0.0
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in Counter(text).values())


def go_regex(pattern: str) -> str:
    """A Go RE2 pattern in Python's syntax (the differences the configuration uses)."""
    out: list[str] = []
    # For each open group (the whole pattern first), how many scoped flag groups were opened
    # in it: they are closed where it closes.
    scoped: list[int] = [0]
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            escape = pattern[i : i + 2]
            out.append("\\Z" if escape == "\\z" else escape)
            i += 2
            continue
        if in_class:
            if char == "]" and not (out and out[-1] in ("[", "[^")):
                in_class = False
            elif char == "[":
                char = "\\["
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            opening = "[^" if pattern[i + 1 : i + 2] == "^" else "["
            out.append(opening)
            i += len(opening)
            continue
        flags = re.match(r"\(\?([a-zA-Z-]+)\)", pattern[i:])
        if flags is not None and (i > 0 or len(scoped) > 1):
            out.append(f"(?{flags.group(1)}:")
            scoped[-1] += 1
            i += flags.end()
            continue
        if char == "(":
            scoped.append(0)
        elif char == ")":
            out.append(")" * scoped.pop())
        out.append(char)
        i += 1
    out.append(")" * scoped[0])
    return "".join(out)


def _allowlists(entries: Sequence[dict[str, Any]]) -> tuple[Allowlist, ...]:
    lists = []
    for entry in entries:
        if entry.get("paths") and entry.get("condition", "OR").upper() == "AND":
            continue  # only for files at those paths: text has none
        regexes = tuple(re.compile(go_regex(r)) for r in entry.get("regexes", ()))
        stopwords = tuple(w.lower() for w in entry.get("stopwords", ()))
        if regexes or stopwords:
            lists.append(Allowlist(regexes, entry.get("regexTarget", "secret"), stopwords))
    return tuple(lists)


@cache
def gitleaks_rules() -> tuple[tuple[GitleaksRule, ...], tuple[Allowlist, ...]]:
    """(the rules, the global allow-lists), read once per process."""
    with CONFIG.open("rb") as file:
        config = tomllib.load(file)
    global_lists = _allowlists([config.get("allowlist", {}), *config.get("allowlists", [])])
    rules = []
    for entry in config["rules"]:
        if entry["id"] in SKIPPED or "path" in entry or "regex" not in entry:
            continue  # a rule for files of some names only: text has no name
        rules.append(
            GitleaksRule(
                id=entry["id"],
                published=entry["regex"],
                keywords=tuple(k.lower() for k in entry["keywords"]),
                entropy=float(entry.get("entropy", 0.0)),
                secret_group=int(entry.get("secretGroup", 0)),
                allowlists=_allowlists(entry.get("allowlists", [])),
            )
        )
    return tuple(rules), global_lists
