"""The risk tier of a code change, from deterministic rules, and the secret scan.

The tier is the highest any rule gives:
- a secret in an added line (any `core.redaction` finds: API keys and tokens, private key
  blocks, `password=`/`*_TOKEN=`/`*_KEY=` assignments of a literal, the process's own
  secrets ...) -> high;
- a path git reads its own configuration, attributes, hooks or submodules from (`.gitconfig`,
  `.config/git/`, `.gitattributes`, `.gitmodules`, `.lfsconfig`, `.githooks/`, `.husky/`, `.git`
  anywhere in a path) or a submodule -> high: such a file names programs for whoever runs git
  on the tree;
- a sensitive path (migrations, settings, CI, auth, dependency manifests) -> medium;
- a deleted file -> medium;
- size: more than MEDIUM_LINES changed lines or MEDIUM_FILES files -> medium, more than
  HIGH_LINES lines -> high.
Secrets are redacted (`sk-ant-…(redacted)`) in everything stored or shown: diff, reasons, events.
The commits themselves keep what the agent wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

from core.redaction import redact, secrets_found

__all__ = ["FileChange", "RiskVerdict", "redact", "risk_assess", "secrets_found"]

MEDIUM_LINES = 300
HIGH_LINES = 1000
MEDIUM_FILES = 20

_TIERS = ("low", "medium", "high")


class FileChange(TypedDict):
    path: str
    status: str  # git's letter: A added, M modified, D deleted, R renamed ...
    additions: int
    deletions: int


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


# Where git (or a tool driving git hooks) reads configuration, attributes, hooks or submodules,
# at any depth, any case. git quotes unusual paths in its listings ("a\tb"): the quotes go first.
_GIT_CONTROL = re.compile(
    r"(?i)(^|/)(\.gitconfig|\.gitattributes|\.gitmodules|\.lfsconfig)$"
    r"|(^|/)(\.config/git|\.githooks|\.husky|\.git)(/|$)"
)


# A diff's header lines for a submodule (a gitlink): its mode, on its own or in the index line.
_GITLINK = re.compile(
    r"^(?:(?:new file|deleted file|old|new) mode 160000|index [0-9a-f]+\.\.[0-9a-f]+ 160000)$"
)


def _gitlinks(diff: str) -> list[str]:
    """The paths whose change is a submodule's, from the diff's header lines."""
    found: list[str] = []
    current = ""
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = line.removeprefix("diff --git ").partition(" b/")[2] or line
        elif current and _GITLINK.match(line) and current not in found:
            found.append(current)
    return found


def _git_control(path: str) -> bool:
    if len(path) >= 2 and path[0] == path[-1] == '"':
        path = path[1:-1]
    return bool(_GIT_CONTROL.search(path))


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
        if _git_control(change["path"]):
            verdict.raise_to(
                "high", f"git configuration, attributes, hooks or modules: {change['path']}"
            )
        for label, pattern in _SENSITIVE:
            if pattern.search(change["path"]):
                verdict.raise_to("medium", f"sensitive path ({label}): {change['path']}")
                break
        if change["status"].startswith("D"):
            verdict.raise_to("medium", f"deletes {change['path']}")
    for path in _gitlinks(diff):
        verdict.raise_to("high", f"a submodule (a repository inside the tree): {path}")
    lines = sum(c["additions"] + c["deletions"] for c in files)
    if lines > HIGH_LINES:
        verdict.raise_to("high", f"large change: {lines} lines (over {HIGH_LINES})")
    elif lines > MEDIUM_LINES:
        verdict.raise_to("medium", f"sizeable change: {lines} lines (over {MEDIUM_LINES})")
    if len(files) > MEDIUM_FILES:
        verdict.raise_to("medium", f"touches {len(files)} files (over {MEDIUM_FILES})")
    return verdict
