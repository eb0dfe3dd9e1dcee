"""The command guard: every part of a shell command is judged danger, caution or safe.

Compound commands (`;`, `&&`, `||`, `|`, `&`, newlines, `$(...)`, backticks, `( ... )`) are split
and every part judged; the command takes the worst tier of its parts. Danger is refused. Caution
is allowed only where a rule (a regex in PSYCHONAUTS_COMMAND_ALLOW) allows that part. A part that
matches a trauma (a pattern that caused an incident before) is escalated one tier.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import PurePosixPath


class Tier(IntEnum):
    SAFE = 0
    CAUTION = 1
    DANGER = 2


@dataclass(frozen=True)
class Part:
    text: str
    piped: bool  # its input comes from the previous part through `|`


@dataclass(frozen=True)
class PartVerdict:
    text: str
    tier: Tier
    reason: str


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    tier: Tier
    reason: str
    parts: tuple[PartVerdict, ...]


_PLACEHOLDER = "$SUBSHELL"


def split_command(command: str) -> list[Part]:
    """Split on shell operators outside quotes; subshell bodies become parts of their own."""
    parts: list[Part] = []
    buf: list[str] = []
    piped = False
    quote = ""
    i, n = 0, len(command)

    def flush(next_piped: bool) -> None:
        nonlocal piped
        text = "".join(buf).strip()
        buf.clear()
        if text:
            parts.append(Part(text, piped))
        piped = next_piped

    while i < n:
        ch = command[i]
        if ch == "\\" and quote != "'" and i + 1 < n:
            buf.append(command[i : i + 2])
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = ""
            elif quote == '"' and (command.startswith("$(", i) or ch == "`"):
                inner, end = _subshell(command, i)
                parts.extend(split_command(inner))
                buf.append(_PLACEHOLDER)
                i = end
                continue
            buf.append(ch)
            i += 1
            continue
        if ch in "'\"":
            quote = ch
            buf.append(ch)
            i += 1
            continue
        if command.startswith(("$(", "<(", ">("), i) or ch in "`(":
            inner, end = _subshell(command, i)
            parts.extend(split_command(inner))
            # The body was judged on its own; the outer part keeps a placeholder for its output
            # (a bare `( ... )` group leaves nothing behind).
            if ch != "(":
                buf.append(f'"{_PLACEHOLDER}"')
            i = end
            continue
        two = command[i : i + 2]
        if two in ("&&", "||"):
            flush(False)
            i += 2
            continue
        if ch == "|":
            flush(True)
            i += 1
            continue
        if ch in ";\n" or (ch == "&" and not (buf and buf[-1] in "<>") and two != "&>"):
            flush(False)
            i += 1
            continue
        buf.append(ch)
        i += 1
    flush(False)
    return parts


def _subshell(command: str, start: int) -> tuple[str, int]:
    """The body of the subshell opening at `start` and the index just after its end."""
    if command[start] == "`":
        end = command.find("`", start + 1)
        end = len(command) if end < 0 else end
        return command[start + 1 : end], end + 1
    open_at = command.index("(", start)
    depth, i, quote = 0, open_at, ""
    while i < len(command):
        ch = command[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return command[open_at + 1 : i], i + 1
        i += 1
    return command[open_at + 1 :], len(command)


_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "python", "python3", "perl", "ruby", "node"}
_FETCHERS = {"curl", "wget"}
_ALWAYS_DANGER = {
    "sudo": "runs as another user",
    "su": "runs as another user",
    "doas": "runs as another user",
    "mkfs": "formats a disk",
    "shutdown": "stops the machine",
    "reboot": "stops the machine",
    "halt": "stops the machine",
    "poweroff": "stops the machine",
    "eval": "runs an unjudgeable string",
}
_SAFE = {
    "ls", "cat", "head", "tail", "wc", "echo", "printf", "grep", "egrep", "rg", "find", "sed",
    "awk", "sort", "uniq", "diff", "pwd", "true", "false", "test", "[", "python", "python3",
    "pytest", "ruff", "mypy", "make", "touch", "mkdir", "cp", "mv", "sleep", "date", "which",
    "tr", "cut", "basename", "dirname", "stat", "file", "tee", "cd", "exit", "seq", "jq",
    "node", "npm", "tsc", "cargo", "go", "black", "isort", "flake8", "tox", "uv",
}  # fmt: skip
_CAUTION = {
    "rm": "deletes files",
    "rmdir": "deletes folders",
    "curl": "reaches the network",
    "wget": "reaches the network",
    "pip": "installs packages",
    "pip3": "installs packages",
    "apt": "installs system packages",
    "apt-get": "installs system packages",
    "docker": "controls containers",
    "ssh": "reaches another machine",
    "scp": "reaches another machine",
    "rsync": "copies across machines",
    "kill": "signals processes",
    "pkill": "signals processes",
    "killall": "signals processes",
    "chmod": "changes permissions",
    "chown": "changes ownership",
    "ln": "creates links",
    "xargs": "runs commands built from input",
    "dd": "writes raw data",
    "env": "runs a command with a changed environment",
    "nohup": "outlives the run",
    "crontab": "schedules work",
}
_GIT_SAFE = {
    "status", "diff", "log", "show", "add", "commit", "branch", "rev-parse", "ls-files",
    "grep", "blame", "stash", "switch", "restore", "mv", "rm", "checkout", "tag",
}  # fmt: skip
_WRITE_TARGET = re.compile(r"(?:^|[^<0-9&])>>?\|?\s*([^\s;&|)]+)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _outside(path: str) -> bool:
    if path in {"/dev/null", "/dev/stdout", "/dev/stderr"} or path.startswith("&"):
        return False
    p = path.strip("'\"")
    return p.startswith(("/", "~", "$HOME")) or ".." in PurePosixPath(p).parts


def judge_part(part: Part, previous: Sequence[Part]) -> PartVerdict:
    text = part.text
    for target in _WRITE_TARGET.findall(text):
        if _outside(target):
            return PartVerdict(text, Tier.DANGER, f"writes outside the workspace ({target})")
    if re.search(r":\s*\(\s*\)\s*\{", text):
        return PartVerdict(text, Tier.DANGER, "fork bomb")
    try:
        tokens = shlex.split(text, comments=False)
    except ValueError:
        return PartVerdict(text, Tier.CAUTION, "cannot be parsed")
    while tokens and _ASSIGNMENT.match(tokens[0]):
        tokens.pop(0)
    if not tokens:
        return PartVerdict(text, Tier.SAFE, "assignment")
    prog, args = PurePosixPath(tokens[0]).name, tokens[1:]
    flags = "".join(a.lstrip("-") for a in args if a.startswith("-") and not a.startswith("--"))
    if prog in _ALWAYS_DANGER or prog.startswith("mkfs."):
        return PartVerdict(text, Tier.DANGER, _ALWAYS_DANGER.get(prog, "formats a disk"))
    if (
        prog in _SHELLS
        and (part.piped or _PLACEHOLDER in text)
        and any(_prog(p) in _FETCHERS for p in previous)
    ):
        return PartVerdict(text, Tier.DANGER, "pipes a download into an interpreter")
    if prog == "rm" and ("r" in flags or "R" in flags or "--recursive" in args):
        targets = [a for a in args if not a.startswith("-")]
        if any(_outside(t) or t in {"*", ".", "./", "/*"} for t in targets) or not targets:
            return PartVerdict(text, Tier.DANGER, "recursive delete of the workspace or beyond")
    if prog == "dd" and any(a.startswith("of=/dev/") for a in args):
        return PartVerdict(text, Tier.DANGER, "writes a device")
    if prog in {"cp", "mv", "tee", "touch", "mkdir", "ln", "install", "dd", "rm", "chmod"}:
        for arg in args:
            value = arg.split("=", 1)[1] if arg.startswith("of=") else arg
            if not arg.startswith("-") and _outside(value):
                return PartVerdict(text, Tier.DANGER, f"writes outside the workspace ({arg})")
    if prog == "git":
        sub = next((a for a in args if not a.startswith("-")), "")
        if sub == "push":
            if any(a in {"-f", "--force", "--force-with-lease", "--mirror"} for a in args) or any(
                a.startswith(("+", "--force")) for a in args
            ):
                return PartVerdict(text, Tier.DANGER, "force-push rewrites shared history")
            return PartVerdict(text, Tier.CAUTION, "publishes to a remote")
        if sub in {"reset", "clean", "rebase", "filter-branch", "remote", "config", "fetch"}:
            return PartVerdict(text, Tier.CAUTION, f"git {sub} changes history or settings")
        if sub in _GIT_SAFE:
            return PartVerdict(text, Tier.SAFE, "read or local git operation")
        return PartVerdict(text, Tier.CAUTION, f"git {sub or '(no subcommand)'}")
    if prog in _CAUTION:
        return PartVerdict(text, Tier.CAUTION, _CAUTION[prog])
    if prog in {"npm", "pip", "uv"} and args[:1] in (["install"], ["add"]):
        return PartVerdict(text, Tier.CAUTION, "installs packages")
    if prog in _SAFE:
        if prog == "sed" and any(a.startswith("-i") for a in args):
            return PartVerdict(text, Tier.SAFE, "edits files in place")
        return PartVerdict(text, Tier.SAFE, "known safe program")
    return PartVerdict(text, Tier.CAUTION, f"{prog}: not a known safe program")


def _prog(part: Part) -> str:
    try:
        tokens = shlex.split(part.text)
    except ValueError:
        return ""
    return PurePosixPath(tokens[0]).name if tokens else ""


def command_judge(
    command: str, *, allow: Sequence[str] = (), traumas: Sequence[tuple[str, str]] = ()
) -> Verdict:
    """Judge a whole command. `allow`: regexes allowing caution parts; `traumas`: (regex, why)."""
    parts = split_command(command)
    if not parts:
        return Verdict(False, Tier.CAUTION, "empty command", ())
    verdicts: list[PartVerdict] = []
    for index, part in enumerate(parts):
        verdict = judge_part(part, parts[:index])
        for pattern, why in traumas:
            if re.search(pattern, part.text):
                tier = Tier(min(verdict.tier + 1, Tier.DANGER))
                verdict = PartVerdict(part.text, tier, f"{verdict.reason}; trauma: {why}")
                break
        verdicts.append(verdict)
    worst = max(verdicts, key=lambda v: v.tier)
    if worst.tier == Tier.DANGER:
        return Verdict(False, Tier.DANGER, f"refused (danger): {worst.text!r}: {worst.reason}",
                       tuple(verdicts))  # fmt: skip
    for v in verdicts:
        if v.tier == Tier.CAUTION and not any(re.search(rule, v.text) for rule in allow):
            return Verdict(
                False,
                Tier.CAUTION,
                f"refused (caution, no rule allows it): {v.text!r}: {v.reason}",
                tuple(verdicts),
            )
    return Verdict(True, worst.tier, "allowed", tuple(verdicts))
