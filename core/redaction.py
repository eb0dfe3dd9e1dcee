"""Secrets out of everything stored, published, logged or printed.

`redact(text)` replaces each secret with a short non-secret prefix and a mark, so that a reader
knows what was there: `sk-ant-…(redacted)`, `AKIA…(redacted)`, `AWS_SECRET_ACCESS_KEY=…(redacted)`,
`-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)`, `postgres://app:…(redacted)@db`, and the
process's own configured secrets by value: `…(redacted SECRET_KEY)`.

Two kinds of rules find them. This module's own: the formats it shows a prefix of, passwords
and tokens assigned to a name (`DB_PASSWORD=…`, `"token": "…"`, a YAML `password:`), given as
a command's option (`--password VALUE`, `mysql -pVALUE`, `curl -u user:pass`, a netrc line),
URL passwords (an `@` in them included), private key blocks (PEM and PuTTY), the process's own
secrets by value and REDACT_EXTRA_PATTERNS. And gitleaks' published rule set (core.secret_rules):
about 220 providers' token formats (Slack, Stripe, Google, npm, PyPI, SendGrid, Vault ...). Where
findings overlap, one mark covers them all.

Text printed by repr() or as JSON is read as what it stands for: a secret after an escaped `\n`,
`\t` or quote is found as after the character itself. A secret is found within one text; one
split between two texts (two writes, two tool calls, a key's lines as separate strings) is not.

The writers call it (events, agent turns and tool calls, diary, comments, reachings, change
reviews, run outcomes, a quantum's text, CLI output); `install_log_redaction` covers every log
record of the process. Git content is not redacted: a file an agent commits stays as it wrote
it, and the change review rates a diff that adds a secret high risk (`secrets_found`).

Agents call this on every turn, so the common case is cheap: every rule's literal keywords are
found in one pass over the lower-cased text (an Aho-Corasick automaton), a text with none is
returned as it is, and only the rules whose keywords occur run (bench/redaction.py measures it).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import unquote, urlsplit

from ahocorasick_rs import AhoCorasick
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from core.secret_rules import Allowlist, GitleaksRule, entropy, gitleaks_rules

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


def _yaml_value(match: re.Match[str]) -> Span:
    """A YAML password's value, unless it is empty, a reference or a YAML keyword."""
    value = match["secret"]
    if _placeholder(value) or value.lower() in _YAML_NOT_SECRET:
        return None
    return match.span("secret")


# YAML's keywords, and the type names of a Python or TypeScript annotation (`password: str`).
_YAML_NOT_SECRET = frozenset(
    {"null", "~", "true", "false", "yes", "no", "none", "''", '""', "str", "string", "bytes",
     "int", "bool", "any", "secretstr", "optional[str]"}
)  # fmt: skip


@dataclass(frozen=True)
class SecretRule:
    """One kind of secret, found by `pattern`.

    Its group `secret` is replaced by the mark; the rest of the match (a prefix such as `sk-ant-`)
    stays, so that a reader knows what was there. `span` may pick another part of the match, or
    None to leave it alone (a reference like `$TOKEN`, a token inside a longer word).
    `needles`: lower-case literals one of which occurs wherever the pattern matches; without
    one in the text the rule is skipped (all rules' needles are found in one pass).
    """

    name: str
    pattern: re.Pattern[str]
    span: Callable[[re.Match[str]], Span] = _secret_group
    needles: tuple[str, ...] = ()
    marks: Mapping[str, str] | None = None  # by matched text: the configured secrets' marks
    # Run on the lower-cased text (a lower-case pattern: case-blind, and still the engine's
    # fast path, which a case-blind pattern is not).
    on_lowered: bool = False


# A private key block: PEM (`-----BEGIN … PRIVATE KEY-----` to its END line) or PuTTY's (its
# header line to the `Private-MAC` line). Streamed text holds a block back until its end.
_PRIVATE_KEY_LINE = r"PRIVATE KEY(?: BLOCK)?-----"
_BEGIN_KEY = re.compile(
    rf"(?:-----BEGIN (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}|PuTTY-User-Key-File-\d+:)(?!…)"
)
_END_KEY = re.compile(rf"-----END (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}|Private-MAC: *[0-9a-fA-F]+")

_PRIVATE_KEYS = (
    SecretRule(
        "private key",
        re.compile(
            rf"-----BEGIN (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}(?!…)"
            rf"(?P<secret>[\s\S]*?(?:-----END (?:[A-Z0-9]+ )*{_PRIVATE_KEY_LINE}|\Z))"
        ),
        needles=("-----begin ",),
    ),
    SecretRule(
        "PuTTY private key",
        re.compile(
            r"PuTTY-User-Key-File-\d+(?>: *[\w@.-]*)(?!…)"
            r"(?P<secret>[\s\S]*?(?:Private-MAC: *[0-9a-fA-F]+|\Z))"
        ),
        needles=("putty-user-key-file-",),
    ),
)

# Options and commands that take a password or token as their next word.
_OPTION_NAMES = (
    r"password|passwd|pass|token|secret|api-key|apikey|access-key|secret-key|auth-token|"
    r"client-secret|private-key-passphrase|passphrase"
)
_ARG_VALUE = r"""(?:'(?P<sq>[^'\n]+)'|"(?P<dq>[^"\n]+)"|(?P<secret>[^\s'"-][^\s'"]*))"""


def _argument(match: re.Match[str]) -> Span:
    for group in ("sq", "dq", "secret"):
        if match[group] is not None:
            return None if _placeholder(match[group]) else match.span(group)
    return None


def _option_argument(match: re.Match[str]) -> Span:
    """The argument, where the name is an option's (`--password`, `--db-token`, `-passphrase`):
    the pattern starts at the name, the engine's fast path; the dashes are checked here."""
    text, at = match.string, match.start()
    while at > 0 and (text[at - 1].isalnum() or text[at - 1] == "-"):
        at -= 1
    prefix = text[at : match.start()]
    if not prefix.startswith("-") or not (prefix.endswith("-") or not prefix):
        return None
    if at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_"):
        return None
    return _argument(match)


def _yaml_key(match: re.Match[str]) -> Span:
    """A YAML mapping's value: the name before the keyword is the line's key
    (`  db_password: …`, `- secret: …`), not a word of prose."""
    text, at = match.string, match.start()
    while at > 0 and (text[at - 1].isalnum() or text[at - 1] in "_.-"):
        at -= 1
    if text[at - 2 : at] == "- ":
        at -= 2
    while at > 0 and text[at - 1] in " \t":
        at -= 1
    if at > 0 and text[at - 1] in "+- " and text[at - 2 : at - 1] in ("", "\n"):
        at -= 1  # a line of a diff
    if at > 0 and text[at - 1] not in "\n\"'":  # a line's start, or a string's (JSON, repr)
        return None
    return _yaml_value(match)


_TOKEN_RULES: tuple[SecretRule, ...] = (
    SecretRule(
        "Anthropic API key",
        re.compile(r"sk-ant-(?P<secret>[A-Za-z0-9_-]{16,})"),
        _word_start(),
        needles=("sk-ant-",),
    ),
    SecretRule(
        "API key (sk-)",
        re.compile(r"sk-(?!ant-)(?:(?:proj|svcacct|admin)-)?(?P<secret>[A-Za-z0-9_-]{20,})"),
        _word_start(),
        needles=("sk-",),
    ),
    SecretRule(
        "AWS access key",
        re.compile(r"A(?:KIA|SIA)(?P<secret>[A-Z0-9]{16})(?![A-Za-z0-9])"),
        _word_start(),
        needles=("akia", "asia"),
    ),
    SecretRule(
        # Said without its name ("the id is AKIA…, its secret wJalr…", "the AWS secret key is
        # wJalr…"): where a text speaks of AWS or a secret, a 40-character mixed-case base64
        # word is an AWS secret key.
        "AWS secret key",
        re.compile(r"(?<![A-Za-z0-9/+=])(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
        _mixed_case,
        needles=("akia", "asia", "aws", "secret"),
    ),
    SecretRule(
        # This project's API tokens (api.services): the prefix that finds the row stays.
        "Annihilation API token",
        re.compile(r"ann_[0-9a-f]{12}_(?P<secret>[A-Za-z0-9_-]{43})(?![A-Za-z0-9_-])"),
        _word_start(),
        needles=("ann_",),
    ),
    SecretRule(
        "GitHub token",
        re.compile(r"g(?:h[pousr]_|ithub_pat_)(?P<secret>[A-Za-z0-9_]{20,})"),
        _word_start("_"),
        needles=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    SecretRule(
        # `eyJ` for `{"`, `eyA` / `ewo` for a header with a space or newline after its brace.
        "JWT",
        re.compile(
            r"e(?:y[JA]|wo)(?P<secret>[A-Za-z0-9_-]{4,}\.e(?:y[JA]|wo)[A-Za-z0-9_-]{4,}"
            r"\.[A-Za-z0-9_-]*)"
        ),
        _word_start("_-"),
        needles=("eyj", "eya", "ewo"),
    ),
    SecretRule(
        "authorization header",
        re.compile(
            r"authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+"
            r"(?P<secret>[a-z0-9._~+/=-]{8,})"
        ),
        needles=("authoriz",),
        on_lowered=True,
    ),
    SecretRule(
        # scheme://user:password@host: the user stays. The password runs to the last `@`
        # before the host (a password may hold `@` unescaped).
        "password in a URL",
        re.compile(
            r"://[^\s:/?#@\"'<>]*:(?P<secret>[^\s/?#\"'<>]+)@(?=[^\s@/?#\"'<>]*(?:[/?#:\"'<>\s]|$))"
        ),
        _unless_placeholder,
        needles=("://",),
    ),
    SecretRule(
        # `--password VALUE`, `--token 'VALUE'` (the `=` form is an assignment, below).
        "password or token option",
        re.compile(rf"(?:{_OPTION_NAMES})[ \t]+{_ARG_VALUE}"),
        _option_argument,
        needles=("pass", "token", "secret", "key"),
        on_lowered=True,
    ),
    SecretRule(
        # `mysql -pVALUE` / `-p VALUE` and the tools that take a password with -p like it.
        "password option (-p)",
        re.compile(
            r"(?:mysql\w*|mariadb\w*|sshpass|(?:docker|podman|buildah|skopeo|helm registry)"
            rf"\s+login)\b[^\n|;&]*?[ \t]-p(?:[ \t]+)?{_ARG_VALUE}"
        ),
        _argument,  # case-sensitive: `-P` is mysql's port
        needles=("mysql", "mariadb", "sshpass", "login"),
    ),
    SecretRule(
        "curl user:password",
        re.compile(
            r"curl\b[^\n|;&]*?[ \t](?:-u|--user)(?:[ \t]+|=)?['\"]?[^\s:'\"]+:"
            r"(?P<secret>[^\s'\"]+)"
        ),
        _unless_placeholder,
        needles=("curl",),
        on_lowered=True,
    ),
    SecretRule(
        "netrc password",
        re.compile(r"machine\s+\S+\s+login\s+\S+\s+password\s+(?P<secret>\S+)"),
        _unless_placeholder,
        needles=("machine",),
    ),
    SecretRule(
        # A YAML mapping's password of any length (`password: pw1`); the assignment rule below
        # takes values of six characters or more anywhere.
        "YAML password",
        re.compile(
            r"(?m)(?:password|passwd|pwd|secret)[ \t]*:[ \t]+"
            r"['\"]?(?P<secret>[^\s'\"#]+)[ \t]*['\"]?[ \t]*(?:#.*)?$"
        ),
        _yaml_key,
        needles=("pass", "pwd", "secret"),
        on_lowered=True,
    ),
)

# `NAME_KEY=…`, `password: …`, `"token": "…"`: found by the keyword and its separator (in the
# lower-cased text: a literal search, where a case-blind pattern tried at every position costs
# ten times more), then the name is read backwards and the value forwards.
_KEYWORD = re.compile(
    r"(?P<kw>password|passwd|pass|pwd|secret|token|key) ?[\"']?\s*(?::=|=(?![=>~])|:(?![:/\\]))"
)
_KEYWORD_ANY_CASE = re.compile(_KEYWORD.pattern, re.IGNORECASE)
_VALUE = re.compile(
    r"(?P<sep> ?[\"']?\s*(?::=|=(?![=>~])|:(?![:/\\]))\s*)"
    r"(?:(?P<q>[\"'`])(?P<quoted>[^\s\"'`]{6,}) ?(?P=q)|(?P<bare>[^\s\"'`]{6,}))"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_AWS_SECRET_NAMES = ("secretaccesskey", "awssecretkey")
_AWS_SECRET_VALUE = re.compile(r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])")
# `…_key`, `apikey`, and the names whose `key` is a secret without a separator (Azure's
# `AccountKey=`, `SharedAccessKey=`).
_KEY_NAMES = ("_key", "-key", ".key", "apikey", "accountkey", "accesskey", "secretkey",
              "privatekey", "signingkey", "masterkey", "encryptionkey")  # fmt: skip
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
    if keyword == "key" and not lname.endswith(_KEY_NAMES):
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


def _assignments(view: str, lowered: str, out: list[_Found]) -> None:
    finder = _KEYWORD
    if len(lowered) != len(view):  # a character whose lower case is longer (İ): positions differ
        lowered, finder = view, _KEYWORD_ANY_CASE
    for hit in finder.finditer(lowered):
        name_end = hit.end("kw")
        start = hit.start("kw")
        while start > 0 and view[start - 1] in _NAME_CHARS:
            start -= 1
        value = _VALUE.match(view, name_end)
        if value is None:
            continue
        secret = _assigned(view[start:name_end], hit["kw"].lower(), value)
        if secret is not None:
            rule, begin, end = secret
            out.append(_Found(begin, end, _REDACTED, rule, start, rank=1))


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
class _Found:
    """A secret at [start, end) of the text, shown as `mark`; `context` is where the finding's
    description starts (its name or prefix). `rank`: which finding's start stands where
    several overlap (the lowest): 0 for a format this module knows (what it keeps of the match,
    a key's header, a token's prefix, a URL's user, is known not to be secret), 1 for an
    assignment (`NAME=value`), 2 for gitleaks' rules."""

    start: int
    end: int
    mark: str
    rule: str
    context: int
    rank: int = 0


# The assignment rule's literals (`_KEYWORD`).
_ASSIGNMENT_NEEDLES = ("password", "passwd", "pass", "pwd", "secret", "token", "key")


@dataclass(frozen=True)
class _Rules:
    # This module's (the configured secrets and the extra patterns among them), then gitleaks'.
    rules: tuple[SecretRule | GitleaksRule, ...]
    gitleaks_allowed: tuple[Allowlist, ...]
    # Every needle and keyword of every rule, found in one pass over the lower-cased text: a
    # rule runs only when one of its own is there, and a text with none has no secret.
    needles: AhoCorasick
    by_needle: dict[str, tuple[int, ...]]  # a needle -> the rules (their index) it starts
    always: tuple[int, ...]  # the rules without needles (REDACT_EXTRA_PATTERNS)
    extra: tuple[re.Pattern[str], ...]  # REDACT_EXTRA_PATTERNS (their own case)

    def candidates(self, present: set[str]) -> list[int]:
        """The rules to run on a text whose needles are `present`, in their order."""
        chosen = set(self.always)
        for needle in present:
            chosen.update(self.by_needle.get(needle, ()))
        return sorted(chosen)


def _build() -> _Rules:
    values = _configured_values()
    rules = list(_PRIVATE_KEYS)
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
    gitleaks, allowed = gitleaks_rules()
    every: list[SecretRule | GitleaksRule] = [*rules, *gitleaks]
    by_needle: dict[str, list[int]] = {needle: [] for needle in _ASSIGNMENT_NEEDLES}
    for index, rule in enumerate(every):
        for needle in rule.needles if isinstance(rule, SecretRule) else rule.keywords:
            by_needle.setdefault(needle, []).append(index)
    return _Rules(
        rules=tuple(every),
        gitleaks_allowed=allowed,
        needles=AhoCorasick(sorted(by_needle)),
        by_needle={needle: tuple(indexes) for needle, indexes in by_needle.items()},
        always=tuple(i for i, rule in enumerate(rules) if not rule.needles),
        extra=extra,
    )


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


@cache
def _any_case(pattern: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern.pattern, pattern.flags | re.IGNORECASE)


def _rule_spans(rule: SecretRule, view: str, lowered: str, out: list[_Found]) -> None:
    pattern = rule.pattern
    if rule.on_lowered:
        if len(lowered) == len(view):
            view = lowered  # the same positions
        else:  # a character whose lower case is longer (İ)
            pattern = _any_case(pattern)
    for match in pattern.finditer(view):
        chosen = rule.span(match)
        if chosen is None or chosen[0] < 0 or chosen[0] == chosen[1]:
            continue
        mark = rule.marks.get(view[chosen[0] : chosen[1]], _REDACTED) if rule.marks else _REDACTED
        out.append(_Found(chosen[0], chosen[1], mark, rule.name, match.start()))


def _line(view: str, start: int, end: int) -> str:
    return view[view.rfind("\n", 0, start) + 1 : (view.find("\n", end) + 1 or len(view) + 1) - 1]


def _gitleaks_spans(
    rule: GitleaksRule, allowed: tuple[Allowlist, ...], view: str, out: list[_Found]
) -> None:
    for match in rule.matches(view):
        start, end = rule.secret_span(match)
        secret = view[start:end]
        if not secret or MARK in secret or _placeholder(secret):
            continue
        if rule.entropy and entropy(secret) <= rule.entropy:
            continue
        lists = allowed + rule.allowlists
        if lists:
            line = _line(view, match.start(), match.end())
            if any(a.allows(secret, match.group(), line) for a in lists):
                continue
        # A token's kind stays readable (`xoxb-…`, `sk_…`, `glpat-…`): a prefix of a few letters
        # and its separator, never digits (the secret itself may start with some).
        kind = _TOKEN_KIND.match(secret)
        if kind is not None and end - start - kind.end() >= 8:
            start += kind.end()
        out.append(_Found(start, end, _REDACTED, rule.id, match.start(), rank=2))


_TOKEN_KIND = re.compile(r"[A-Za-z]{2,8}[_.-]")


# Escapes of repr() and JSON output (a newline, a tab, a quote): a secret beside one is found as
# beside the character itself. The text is read with each escape's backslash as a space and a
# newline or tab for its letter: positions stay the same.
_ESCAPED = re.compile(r"\\[ntr'\"]")
_UNESCAPED = {"\\n": " \n", "\\t": "  ", "\\r": "  ", "\\'": " '", '\\"': ' "'}


def _unescaped(match: re.Match[str]) -> str:
    return _UNESCAPED[match.group()]


# Shorter strings (the payloads' many ids, names and phases) are not read: a built-in rule only
# ever matches eight characters or more, bar a URL with a password of one or two.
_SHORTEST = 8


def _scan(text: str, found: list[str] | None) -> str:
    rules = _active()
    if len(text) < _SHORTEST and not rules.extra:
        return text
    view = _ESCAPED.sub(_unescaped, text) if "\\" in text else text
    lowered = view.lower()
    present = set(rules.needles.find_matches_as_strings(lowered, overlapping=True))
    if not present and not (rules.extra and any(p.search(text) for p in rules.extra)):
        return text
    spans: list[_Found] = []
    for index in rules.candidates(present):
        rule = rules.rules[index]
        if isinstance(rule, SecretRule):
            _rule_spans(rule, view, lowered, spans)
        else:
            _gitleaks_spans(rule, rules.gitleaks_allowed, view, spans)
    if not present.isdisjoint(_ASSIGNMENT_NEEDLES):
        _assignments(view, lowered, spans)
    if not spans:
        return text
    return _redacted(text, spans, found)


def _redacted(text: str, spans: list[_Found], found: list[str] | None) -> str:
    """The text with each span replaced by its mark (overlapping ones by one); each described
    in `found`."""
    spans.sort(key=lambda f: (f.start, -f.end))
    groups: list[list[_Found]] = []  # spans that overlap or touch, in order
    end = -1
    for span in spans:
        if groups and span.start <= end:
            groups[-1].append(span)
        else:
            groups.append([span])
        end = max(end, span.end) if len(groups[-1]) > 1 else span.end
    merged: list[_Found] = []
    for group in groups:
        # The best-ranked finding's start stands when what it keeps is its own match's start
        # (a prefix it knows); otherwise the earliest. The end is the farthest any found.
        earliest = group[0].start
        best = min(group, key=lambda f: (f.rank, f.start))
        first = best if best.context <= earliest else group[0]
        last_end = max(f.end for f in group)
        merged.append(_Found(first.start, last_end, first.mark, first.rule, first.context))
    pieces: list[str] = []
    done = 0
    for span in merged:
        pieces += [text[done : span.start], span.mark]
        done = span.end
        if found is not None:
            # What the match kept before the mark, on the mark's line, and a closing quote.
            kept = text[min(span.context, span.start) : span.start].rsplit("\n", 1)[-1]
            quote = text[span.end : span.end + 1] if text[span.end : span.end + 1] in "\"'" else ""
            found.append(f"{span.rule}: {kept}{span.mark}{quote}")
    pieces.append(text[done:])
    return "".join(pieces)


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


# A key block held back longer than this (no private key is near it) is let out redacted to
# where it has come, and what follows is dropped until its end line: memory and the rescans of
# the held text stay bounded whatever a stream sends.
_HOLD_MAX = 64 * 1024


class TextStream:
    """Streamed text (a model's deltas), redacted as it comes: only whole lines are let out, so a
    secret is never cut in two between pieces, and nothing of a private key block is let out
    until its END line has come. `finish` lets out the rest at the end of the stream.

    A secret is found within what one stream carries; one split between two streams (two tool
    calls, two writes) is two harmless halves to each."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._dropping = False  # inside a key block past _HOLD_MAX: dropped until its end

    def feed(self, delta: str) -> str:
        """What may be shown now (redacted), often ""."""
        self._parts.append(delta)
        if "\n" not in delta:
            return ""
        text = "".join(self._parts)
        cut = text.rfind("\n") + 1
        if self._dropping:
            end = _END_KEY.search(text, 0, cut)
            if end is None:
                self._parts = [text[cut:]] if cut < len(text) else []
                return ""
            self._dropping = False
            text, cut = text[end.end() :], cut - end.end()
        begins = list(_BEGIN_KEY.finditer(text, 0, cut))
        if begins and _END_KEY.search(text, begins[-1].end(), cut) is None:
            if cut - begins[-1].start() > _HOLD_MAX:
                self._dropping = True  # redacted below to the end: the rest is the block's
                self._parts = [text[cut:]] if cut < len(text) else []
                return redact(text[:cut])
            cut = begins[-1].start()  # held from the block's first line until its END comes
        self._parts = [text[cut:]] if cut < len(text) else []
        return redact(text[:cut])

    def finish(self) -> str:
        """The rest (redacted; a key block that never ended is redacted to its end)."""
        text = "".join(self._parts)
        self._parts = []
        if self._dropping:
            self._dropping = False
            end = _END_KEY.search(text)
            text = text[end.end() :] if end is not None else ""
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
