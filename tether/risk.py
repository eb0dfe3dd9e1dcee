"""The risk tier of a code change, from deterministic rules, and the secret scan.

The tier is the highest any rule gives:
- a secret in an added line (AWS access key, `sk-...`/`sk-ant-...` token, GitHub token, private
  key block, `password=`/`token=`/`secret=` assignment of a literal) -> high;
- a sensitive path (migrations, settings, CI, auth, dependency manifests) -> medium;
- a deleted file -> medium;
- size: more than MEDIUM_LINES changed lines or MEDIUM_FILES files -> medium, more than
  HIGH_LINES lines -> high.
Secrets are redacted (`sk-ant-…(redacted)`) in everything stored or shown: diff, reasons, events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

MEDIUM_LINES = 300
HIGH_LINES = 1000
MEDIUM_FILES = 20

_TIERS = ("low", "medium", "high")


class FileChange(TypedDict):
    path: str
    status: str  # git's letter: A added, M modified, D deleted, R renamed ...
    additions: int
    deletions: int


@dataclass(frozen=True)
class SecretRule:
    name: str
    pattern: re.Pattern[str]
    keep: int  # characters of the match kept before the redaction mark


# Each pattern's group 1 (when present) is the secret part; the text before it is kept.
SECRET_RULES: tuple[SecretRule, ...] = (
    SecretRule(
        "private key",
        re.compile(
            r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----(?:.|\n)*?(?:-----END (?:[A-Z]+ )?PRIVATE KEY-----|\Z)"
        ),
        len("-----BEGIN"),
    ),
    SecretRule("Anthropic API key", re.compile(r"\bsk-ant-[A-Za-z0-9_-]{16,}"), len("sk-ant-")),
    SecretRule("API key (sk-)", re.compile(r"\bsk-(?!ant-)[A-Za-z0-9_-]{20,}"), len("sk-")),
    SecretRule("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), 4),
    SecretRule(
        "GitHub token",
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
        4,
    ),
    SecretRule(
        "password or token assignment",
        re.compile(
            r"""(?i)\b[\w.-]*(?:password|passwd|secret|token|api_key|apikey)["']?\s*[:=]\s*"""
            r"""["']?[^\s"'#,;)]{6,}"""
        ),
        -1,  # keep the name and the `=`: redact the value only
    ),
)

_ASSIGN_VALUE = re.compile(r"""[:=]\s*["']?""")


def _redacted(rule: SecretRule, text: str) -> str:
    if rule.keep >= 0:
        return text[: rule.keep] + "…(redacted)"
    match = _ASSIGN_VALUE.search(text)
    end = match.end() if match else 0
    return text[:end] + "…(redacted)"


def redact(text: str) -> str:
    """The text with every secret replaced by its first few characters and `…(redacted)`."""
    for rule in SECRET_RULES:
        text = rule.pattern.sub(lambda m, r=rule: _redacted(r, m.group(0)), text)  # type: ignore[misc]
    return text


def secrets_found(text: str) -> list[str]:
    """One redacted description per secret found, e.g. `Anthropic API key sk-ant-…(redacted)`."""
    found: list[str] = []
    for rule in SECRET_RULES:
        for match in rule.pattern.finditer(text):
            shown = _redacted(rule, match.group(0)).splitlines()[0]
            found.append(f"{rule.name}: {shown}")
    return found


def _added_lines(diff: str) -> str:
    """Only what the change adds: removing a leaked key is not a leak."""
    return "\n".join(
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


_SENSITIVE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("migration", re.compile(r"(^|/)migrations/")),
    (
        "settings",
        re.compile(r"(^|/)(settings[^/]*\.py|\.env[^/]*|config/[^/]*\.(ya?ml|toml|ini))$"),
    ),
    (
        "CI",
        re.compile(
            r"(^|/)(\.github/|\.gitlab-ci\.yml$|\.ci/|\.circleci/|Jenkinsfile$|\.travis\.yml$"
            r"|Makefile$|Dockerfile$|docker-compose[^/]*\.ya?ml$)"
        ),
    ),
    ("auth", re.compile(r"(?i)(^|/)[^/]*(auth|login|password|permission|crypt|secret)[^/]*$")),
    (
        "dependency manifest",
        re.compile(
            r"(^|/)(requirements[^/]*\.txt|pyproject\.toml|setup\.py|setup\.cfg|Pipfile(\.lock)?"
            r"|poetry\.lock|package(-lock)?\.json|yarn\.lock|pnpm-lock\.yaml|Gemfile(\.lock)?"
            r"|go\.(mod|sum)|Cargo\.(toml|lock))$"
        ),
    ),
)


@dataclass
class RiskVerdict:
    risk: str = "low"
    reasons: list[str] = field(default_factory=list)

    def raise_to(self, tier: str, reason: str) -> None:
        if _TIERS.index(tier) > _TIERS.index(self.risk):
            self.risk = tier
        self.reasons.append(f"{tier}: {reason}")


def risk_assess(*, files: list[FileChange], diff: str) -> RiskVerdict:
    """The tier and the reasons (already redacted) for a change."""
    verdict = RiskVerdict()
    for secret in secrets_found(_added_lines(diff)):
        verdict.raise_to("high", f"secret in the diff ({secret})")
    for change in files:
        for label, pattern in _SENSITIVE:
            if pattern.search(change["path"]):
                verdict.raise_to("medium", f"sensitive path ({label}): {change['path']}")
                break
        if change["status"].startswith("D"):
            verdict.raise_to("medium", f"deletes {change['path']}")
    lines = sum(c["additions"] + c["deletions"] for c in files)
    if lines > HIGH_LINES:
        verdict.raise_to("high", f"large change: {lines} lines (over {HIGH_LINES})")
    elif lines > MEDIUM_LINES:
        verdict.raise_to("medium", f"sizeable change: {lines} lines (over {MEDIUM_LINES})")
    if len(files) > MEDIUM_FILES:
        verdict.raise_to("medium", f"touches {len(files)} files (over {MEDIUM_FILES})")
    return verdict
