"""The text rules of reflection: normalising a rule, its polarity ("never X" against "X") and
the key terms the evidence gate searches for."""

from __future__ import annotations

import re

KEY_TERMS = 3
_STOP = frozenset(
    [
        "the",
        "a",
        "an",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "for",
        "with",
        "by",
        "at",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "not",
        "never",
        "always",
        "do",
        "does",
        "did",
        "don",
        "avoid",
        "should",
        "must",
        "when",
        "then",
        "than",
        "into",
        "as",
        "use",
        "using",
    ]
)
_NEGATION = re.compile(r"^(never|do not|don't|dont|avoid:?|avoid)\s+")
_AFFIRM = re.compile(r"^(always|please)\s+")


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def polarity(text: str) -> tuple[bool, str]:
    """(negative, core): "never X" / "do not X" / "Avoid: X" are negative, "always X" / "X"
    positive, and both share the core "x"."""
    lowered = " ".join(text.lower().strip().split())
    negative = bool(_NEGATION.match(lowered))
    lowered = _NEGATION.sub("", lowered) if negative else _AFFIRM.sub("", lowered)
    return negative, normalise(lowered)


def key_terms(text: str) -> list[str]:
    words = [w for w in normalise(text).split() if w not in _STOP and len(w) > 2]
    seen: list[str] = []
    for word in sorted(words, key=len, reverse=True):
        if word not in seen:
            seen.append(word)
    return seen[:KEY_TERMS]
