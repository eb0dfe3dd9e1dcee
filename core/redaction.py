"""Secrets out of everything stored, published, logged or printed.

`redact(text)` replaces each secret with a short non-secret prefix and a mark, so that a reader
knows what was there: `sk-ant-…(redacted)`, `AKIA…(redacted)`, `AWS_SECRET_ACCESS_KEY=…(redacted)`,
`-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)`, `postgres://app:…(redacted)@db`, and the
process's own configured secrets by value: `…(redacted SECRET_KEY)`.

The writers call it (events, agent turns and tool calls, diary, comments, reachings, change
reviews, run outcomes, CLI output); `install_log_redaction` covers every log record of the
process. Git content is not redacted: a file an agent commits stays as it wrote it, and the change
review rates a diff that adds a secret high risk (`secrets_found`).

Agents call this on every turn, so the common case is cheap: a short text without any of the
rules' literal hints is returned as it is after one search, and each rule of a longer one starts
from a literal the regex engine looks for about as fast as a substring search.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MARK = "…(redacted"  # every mark contains it: a value holding it was redacted already
_REDACTED = "…(redacted)"

# A configured secret shorter than this, or made of letters only and shorter than _WEAK_BELOW,
# is not replaced by value: `postgres` as a password would blank out every mention of Postgres.
_MIN_CONFIGURED = 8
_WEAK_BELOW = 16
_CONFIGURED_SUFFIXES = ("_KEY", "_SECRET", "_TOKEN", "_PASSWORD")

Span = tuple[int, int] | None


def _secret_group(match: re.Match[str]) -> Span:
    return match.span("secret")


def _word_start(also: str = "") -> Callable[[re.Match[str]], Span]:
    """The secret group, unless the match continues a longer word (`task-…`, `xAKIA…`)."""

    def span(match: re.Match[str]) -> Span:
        at = match.start()
        before = match.string[at - 1] if at else " "
        return None if before.isalnum() or before in also else match.span("secret")

    return span


def _placeholder(value: str) -> bool:
    """A reference or a mask, not a secret: `$TOKEN`, `${{ secrets.X }}`, `<your key>`, `****`."""
    return value.startswith(("$", "{", "%(", "<", "*", "…")) or MARK in value


def _unless_placeholder(match: re.Match[str]) -> Span:
    return None if _placeholder(match["secret"]) else match.span("secret")


def _mixed_case(match: re.Match[str]) -> Span:
    """Upper and lower case letters and a digit: a random key, not a word, a path or a hash
    (a git sha is lower-case hexadecimal)."""
    value = match["secret"]
    kinds = (str.isupper, str.islower, str.isdigit)
    return match.span("secret") if all(any(map(k, value)) for k in kinds) else None


@dataclass(frozen=True)
class SecretRule:
    """One kind of secret, found by `pattern`.

    Its group `secret` is replaced by the mark; the rest of the match (a prefix such as `sk-ant-`)
    stays, so that a reader knows what was there. `span` may pick another part of the match, or
    None to leave it alone (a reference like `$TOKEN`, a token inside a longer word).
    `needles`: lower-case literals one of which occurs wherever the pattern matches; without
    one in the text the rule is skipped. Built-in rules without needles begin with a literal,
    which the regex engine looks for about as fast as a substring search.
    """

    name: str
    pattern: re.Pattern[str]
    span: Callable[[re.Match[str]], Span] = _secret_group
    needles: tuple[str, ...] = ()
    marks: Mapping[str, str] | None = None  # by matched text: the configured secrets' marks


_PRIVATE_KEY_LINE = r"PRIVATE KEY(?: BLOCK)?-----"
_BEGIN_KEY = re.compile(rf"-----BEGIN (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}")
_END_KEY = re.compile(rf"-----END (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}")

_PRIVATE_KEY = SecretRule(
    "private key",
    re.compile(
        rf"{_BEGIN_KEY.pattern}(?!…)"
        rf"(?P<secret>[\s\S]*?(?:{_END_KEY.pattern}|\Z))"  # an unfinished block: to the end
    ),
)

_TOKEN_RULES: tuple[SecretRule, ...] = (
    SecretRule(
        "Anthropic API key",
        re.compile(r"sk-ant-(?P<secret>[A-Za-z0-9_-]{16,})"),
        _word_start(),
    ),
    SecretRule(
        "API key (sk-)",
        re.compile(r"sk-(?!ant-)(?:(?:proj|svcacct|admin)-)?(?P<secret>[A-Za-z0-9_-]{20,})"),
        _word_start(),
    ),
    SecretRule(
        "AWS access key",
        re.compile(r"A(?:KIA|SIA)(?P<secret>[A-Z0-9]{16})(?![A-Za-z0-9])"),
        _word_start(),
    ),
    SecretRule(
        # Said without its name ("the id is AKIA…, its secret wJalr…"): where a text has an
        # access key id, a 40-character mixed-case base64 word beside it is its secret key.
        "AWS secret key",
        re.compile(r"(?<![A-Za-z0-9/+=])(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
        _mixed_case,
        needles=("akia", "asia"),
    ),
    SecretRule(
        # This project's API tokens (api.services): the prefix that finds the row stays.
        "Annihilation API token",
        re.compile(r"ann_[0-9a-f]{12}_(?P<secret>[A-Za-z0-9_-]{43})(?![A-Za-z0-9_-])"),
        _word_start(),
    ),
    SecretRule(
        "GitHub token",
        re.compile(r"g(?:h[pousr]_|ithub_pat_)(?P<secret>[A-Za-z0-9_]{20,})"),
        _word_start("_"),
    ),
    SecretRule(
        "JWT",
        re.compile(r"eyJ(?P<secret>[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*)"),
        _word_start("_-"),
    ),
    SecretRule(
        "authorization header",
        re.compile(
            r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+"
            r"(?P<secret>[A-Za-z0-9._~+/=-]{8,})"
        ),
        needles=("authoriz",),
    ),
    SecretRule(
        "password in a URL",  # scheme://user:password@host: the user stays
        re.compile(r"://[^\s:/?#@\"'<>]*:(?P<secret>[^\s/?#@\"'<>]+)@"),
        _unless_placeholder,
    ),
)

# `NAME_KEY=…`, `password: …`, `"token": "…"`: found by the keyword and its separator (in the
# lower-cased text: a literal search, where a case-blind pattern tried at every position costs
# ten times more), then the name is read backwards and the value forwards.
_KEYWORD = re.compile(
    r"(?P<kw>password|passwd|pass|pwd|secret|token|key)[\"']?\s*(?::=|=(?![=>~])|:(?![:/\\]))"
)
_KEYWORD_ANY_CASE = re.compile(_KEYWORD.pattern, re.IGNORECASE)
_VALUE = re.compile(
    r"(?P<sep>[\"']?\s*(?::=|=(?![=>~])|:(?![:/\\]))\s*)"
    r"(?:(?P<q>[\"'`])(?P<quoted>[^\s\"'`]{6,})(?P=q)|(?P<bare>[^\s\"'`]{6,}))"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_AWS_SECRET_NAMES = ("secretaccesskey", "awssecretkey")
_AWS_SECRET_VALUE = re.compile(r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])")
# Code, not a literal: an identifier or dotted name without digits (`settings.SECRET_KEY`,
# `password_from_env`), or a number. Random secrets of eight characters or more nearly always
# have a digit; a letters-only literal written unquoted is missed, the price of not blanking code.
_CODE_VALUE = re.compile(r"[A-Za-z_]+(?:\.[A-Za-z_]\w*)*|[\d.]+")
_VALUE_END = re.compile(r"[,;&(){}\[\]<>]")
_PUBLIC = ("public_key", "publickey", "public-key", "public.key")


def _assigned(name: str, keyword: str, value: re.Match[str]) -> tuple[str, int, int] | None:
    """(rule name, start, end) of the secret in `name<sep><value>`, or None: not a secret."""
    lname = name.lower()
    literal = value["quoted"] if value["quoted"] is not None else value["bare"]
    start = value.start("quoted") if value["quoted"] is not None else value.start("bare")
    compact = lname.replace("_", "").replace("-", "").replace(".", "")
    if compact.endswith(_AWS_SECRET_NAMES) and _AWS_SECRET_VALUE.match(literal):
        return "AWS secret key", start, start + 40
    if keyword == "key" and not lname.endswith(("_key", "-key", ".key", "apikey")):
        return None  # `monkey`, `key`: a bare `key = …` is everywhere in code
    if keyword in {"pass", "pwd"} and not lname[: -len(keyword)].endswith(("_", "-", ".")):
        return None  # `bypass`, `pwd`: `DB_PASS` and `DB_PWD` are the names meant
    if lname.endswith(_PUBLIC):
        return None
    # `DB_PASSWORD=…` (an environment line) and `--token=…` (an option) are always literals;
    # elsewhere an unquoted value may be code.
    if value["quoted"] is None and not (
        value["sep"] == "=" and (name.isupper() or name.startswith("-"))
    ):
        cut = _VALUE_END.search(literal)
        if cut is not None:
            if literal[cut.start()] in "([{<":
                return None  # a call, subscript or literal: `password = get_password()`
            literal = literal[: cut.start()]
        if len(literal) < 6 or _CODE_VALUE.fullmatch(literal):
            return None
    if _placeholder(literal):
        return None
    return "password or token assignment", start, start + len(literal)


def _assignments(text: str, found: list[str] | None) -> str:
    lowered, finder = text.lower(), _KEYWORD
    if len(lowered) != len(text):  # a character whose lower case is longer (İ): positions differ
        lowered, finder = text, _KEYWORD_ANY_CASE
    pieces: list[str] = []
    done = 0  # the text up to here is in `pieces`
    for hit in finder.finditer(lowered):
        name_end = hit.end("kw")
        start = hit.start("kw")
        if start < done:
            continue  # inside a value just redacted
        while start > done and text[start - 1] in _NAME_CHARS:
            start -= 1
        value = _VALUE.match(text, name_end)
        if value is None:
            continue
        name = text[start:name_end]
        secret = _assigned(name, hit["kw"].lower(), value)
        if secret is None:
            continue
        rule, begin, end = secret
        pieces += [text[done:begin], _REDACTED]
        done = end
        if found is not None:
            found.append(f"{rule}: {text[start:begin]}{_REDACTED}{value['q'] or ''}")
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _configured_values() -> dict[str, str]:
    """The process's own secrets by value -> the name its mark shows."""
    found: dict[str, str] = {}

    def add(value: object, name: str) -> None:
        if not isinstance(value, str) or len(value) < _MIN_CONFIGURED:
            return
        if value.isalpha() and len(value) < _WEAK_BELOW:
            return
        found.setdefault(value, name)

    add(settings.SECRET_KEY, "SECRET_KEY")
    add(settings.ANTHROPIC_API_KEY, "ANTHROPIC_API_KEY")
    add(settings.DATABASES.get("default", {}).get("PASSWORD", ""), "DATABASE_URL password")
    urls = {
        # Read into DATABASES by the settings, not kept as a setting of its own.
        "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND,
    }
    for name, url in urls.items():
        if isinstance(url, str) and "@" in url:
            try:
                password = urlsplit(url).password
            except ValueError:
                continue
            add(unquote(password or ""), f"{name} password")
    for name, value in os.environ.items():
        if name.upper().endswith(_CONFIGURED_SUFFIXES):
            add(value, name)
    return found


@dataclass(frozen=True)
class _Rules:
    rules: tuple[SecretRule, ...]
    hint: re.Pattern[str]  # on the lower-cased text: found wherever a built-in rule could match
    extra: tuple[re.Pattern[str], ...]  # REDACT_EXTRA_PATTERNS (their own case)


_HINTS = (
    r"-----begin |sk-|akia|asia|ann_|gh[pousr]_|github_pat_|eyj|authoriz|://|"
    + _KEYWORD.pattern.replace("(?P<kw>", "(?:")
)


def _build() -> _Rules:
    values = _configured_values()
    rules = [_PRIVATE_KEY]  # a key block first: its lines are not read as other secrets
    hints = [_HINTS]
    if values:
        ordered = sorted(values, key=len, reverse=True)  # the longest first: one may hold another
        rules.append(
            SecretRule(
                "configured secret",
                re.compile("(?P<secret>" + "|".join(re.escape(v) for v in ordered) + ")"),
                needles=tuple(sorted({v.lower() for v in ordered})),
                marks={value: f"…(redacted {name})" for value, name in values.items()},
            )
        )
        hints += [re.escape(v.lower()) for v in ordered]
    extra = tuple(re.compile(p) for p in settings.REDACT_EXTRA_PATTERNS)
    for pattern in extra:
        # The match is redacted, or only its first group when it has groups.
        whole = pattern.groups == 0
        rules.append(
            SecretRule(
                f"pattern {pattern.pattern}",
                pattern,
                (lambda m: m.span(0)) if whole else (lambda m: m.span(1)),
            )
        )
    rules += _TOKEN_RULES
    return _Rules(tuple(rules), re.compile("|".join(hints)), extra)


_rules: _Rules | None = None
_rules_lock = threading.Lock()


def _active() -> _Rules:
    """The rules, built on first use from the settings and the environment."""
    global _rules
    rules = _rules
    if rules is None:
        with _rules_lock:
            if _rules is None:
                _rules = _build()
            rules = _rules
    return rules


def extra_patterns_check() -> None:
    """REDACT_EXTRA_PATTERNS are valid regular expressions, or ImproperlyConfigured says which
    is not (the core app checks at start-up)."""
    for text in settings.REDACT_EXTRA_PATTERNS:
        try:
            re.compile(text)
        except re.error as exc:
            raise ImproperlyConfigured(
                f"ANNIHILATION_REDACT_PATTERNS: {text!r} is not a valid regular expression: {exc}"
            ) from None


def redaction_reload() -> None:
    """Forget the rules built from the settings and environment; they are built again on next
    use (after changing either, as tests do)."""
    global _rules
    with _rules_lock:
        _rules = None


def _apply(rule: SecretRule, text: str, found: list[str] | None) -> str:
    def replace(match: re.Match[str]) -> str:
        chosen = rule.span(match)
        whole = match.group(0)
        if chosen is None or chosen[0] < 0:
            return whole
        base = match.start()
        start, end = chosen[0] - base, chosen[1] - base
        mark = rule.marks.get(whole[start:end], _REDACTED) if rule.marks else _REDACTED
        out = whole[:start] + mark + whole[end:]
        if found is not None:
            found.append(f"{rule.name}: {(out.splitlines() or [out])[0]}")
        return out

    return rule.pattern.sub(replace, text)


# Up to this length one search of the combined hint decides that a text has no secret (~2 us for
# a line). A longer text is cheaper to give to each rule: the hint, many alternatives tried at
# every common letter, costs ~30 ns a character, the rules' literal searches together ~10.
_SHORT = 256
# Shorter strings (the payloads' many ids, names and phases) skip even the hint: a built-in rule
# only ever matches eight characters or more, bar a URL with a password of one or two.
_SHORTEST = 8


def _scan(text: str, found: list[str] | None) -> str:
    rules = _active()
    hinted = len(text) > _SHORT or (
        len(text) >= _SHORTEST and rules.hint.search(text.lower()) is not None
    )
    if not hinted and not (rules.extra and any(p.search(text) for p in rules.extra)):
        return text
    lowered: str | None = None
    for rule in rules.rules:
        if rule.needles:
            if lowered is None:
                lowered = text.lower()
            if not any(needle in lowered for needle in rule.needles):
                continue
        redacted = _apply(rule, text, found)
        if redacted is not text:
            text, lowered = redacted, None
    return _assignments(text, found)


def redact(text: str) -> str:
    """The text with every secret replaced by its non-secret prefix and a mark; the same string
    when there is none."""
    return _scan(text, None) if text else text


def secrets_found(text: str) -> list[str]:
    """One redacted description per secret found, e.g. `Anthropic API key: sk-ant-…(redacted)`."""
    found: list[str] = []
    _scan(text, found)
    return found


def redact_data(value: Any) -> Any:
    """`value` with every string in it redacted, dict keys too, through dicts, lists and tuples.
    A new structure where something changed; the objects themselves where nothing did."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        changed = False
        items = []
        for key, item in value.items():
            new_key = redact(key) if isinstance(key, str) else key
            new_item = redact_data(item)
            changed = changed or new_key is not key or new_item is not item
            items.append((new_key, new_item))
        return dict(items) if changed else value
    if isinstance(value, list | tuple):
        new = [redact_data(item) for item in value]
        if all(a is b for a, b in zip(new, value, strict=True)):
            return value
        return new if isinstance(value, list) else tuple(new)
    return value


class TextStream:
    """Streamed text (a model's deltas), redacted as it comes: only whole lines are let out, so a
    secret is never cut in two between pieces, and nothing of a private key block is let out
    until its END line has come. `finish` lets out the rest at the end of the stream."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def feed(self, delta: str) -> str:
        """What may be shown now (redacted), often ""."""
        self._parts.append(delta)
        if "\n" not in delta:
            return ""
        text = "".join(self._parts)
        cut = text.rfind("\n") + 1
        begins = list(_BEGIN_KEY.finditer(text, 0, cut))
        if begins and _END_KEY.search(text, begins[-1].end(), cut) is None:
            cut = begins[-1].start()  # held from the block's first line until its END comes
        self._parts = [text[cut:]] if cut < len(text) else []
        return redact(text[:cut])

    def finish(self) -> str:
        """The rest (redacted; a key block that never ended is redacted to its end)."""
        text = "".join(self._parts)
        self._parts = []
        return redact(text)


# --- logging ---------------------------------------------------------------------------------

_TRACEBACKS = logging.Formatter()


def redact_record(record: logging.LogRecord) -> None:
    """The record's message formatted and redacted (`msg` the text, `args` empty), and its
    traceback formatted and redacted into `exc_text`, which formatters print as it is."""
    try:
        message = record.getMessage()
    except Exception:
        # A broken format: the handler reports it, printing msg and args.
        record.msg = redact(str(record.msg))
        record.args = redact_data(record.args)
    else:
        redacted = redact(message)
        if record.args or redacted is not message or not isinstance(record.msg, str):
            record.msg, record.args = redacted, ()
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    elif record.exc_info and record.exc_info[0] is not None:
        record.exc_text = redact(_TRACEBACKS.formatException(record.exc_info))


class RedactingFilter(logging.Filter):
    """For a handler: redacts each record it handles (records made by `makeLogRecord`, e.g.
    from a socket, bypass the record factory)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


class _RedactingRecordFactory:
    """Wraps the process's log record factory: every record is redacted when it is made, before
    any handler sees it, whichever handlers are installed later (Celery replaces them)."""

    def __init__(self, base: Callable[..., logging.LogRecord]) -> None:
        self.base = base

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        redact_record(record)
        return record


def install_log_redaction() -> None:
    """Redact every log record of this process (idempotent)."""
    current = logging.getLogRecordFactory()
    if not isinstance(current, _RedactingRecordFactory):
        logging.setLogRecordFactory(_RedactingRecordFactory(current))
