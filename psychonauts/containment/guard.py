"""The command guard: every part of a shell command is judged danger, caution or safe.

Compound commands (`;`, `&&`, `||`, `|`, `&`, newlines, `$(...)`, backticks, `( ... )`) are split
and every part judged; the command takes the worst tier of its parts. Danger is refused. Caution
is allowed only where a rule (a regex in PSYCHONAUTS_COMMAND_ALLOW) allows that part. A part (or
the whole command) that matches a trauma (a pattern that caused an incident before) is escalated
one tier.

The guard is the policy layer: it tells the model early what will not work and records the
decision. The boundary is the sandbox the allowed commands run in (psychonauts/containment/sandbox.py), and
the guard judges with it in mind (`Policy`). With the sandbox on, whatever the sandbox holds is
allowed: inline code (`python3 -c`, `node -e`, `bash -c`, whose script is judged in turn), unknown
programs, installers, `find -exec`, `xargs`, permissions and links inside the worktree, signals
(its own PID namespace), writes to its private `/tmp`. Refused still: what is hostile in shape
whatever holds it (writes outside the worktree, `sudo`, fork bombs, reading other processes'
memory, force pushes), what the sandbox cannot undo (a recursive delete of the whole worktree),
what it cannot do (git writes: the repository is read-only inside; the runtime commits), and,
when the sandbox has the network, what reaches it. With `ANNIHILATION_SANDBOX=off` nothing holds
a command but the guard: every caution is refused unless a rule allows it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Policy:
    """What holds a command besides the guard."""

    sandboxed: bool = False  # it runs in the sandbox (ANNIHILATION_SANDBOX is not off)
    network: bool = False  # the sandbox lets it reach the network


STRICT = Policy()


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
# `>`, `>>`, `>|`, `2>`, `1>>`, `&>` and `&>>`, with what they write to (`2>&1` writes no file).
_WRITE_TARGET = re.compile(r"(?:^|[^<>])(?:[0-9]*|&)>>?\|?\s*([^\s;&|)]+)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


# The sandbox's own scratch folders: private to each command, gone when it ends.
_SANDBOX_SCRATCH = ("/tmp/", "/dev/shm/", "$TMPDIR/", "${TMPDIR}/")


def _outside(path: str, policy: Policy = STRICT) -> bool:
    if path in {"/dev/null", "/dev/stdout", "/dev/stderr"} or path.startswith("&"):
        return False
    p = path.strip("'\"")
    if policy.sandboxed and p.startswith(_SANDBOX_SCRATCH) and ".." not in PurePosixPath(p).parts:
        return False
    return p.startswith(("/", "~", "$HOME", "$")) or ".." in PurePosixPath(p).parts


def _values(args: Iterable[str]) -> list[str]:
    """Every argument and every `--option=value`'s value: where a program may be told a path."""
    found = []
    for arg in args:
        if arg.startswith("-") and "=" in arg:
            found.append(arg.split("=", 1)[1])
        elif not arg.startswith("-"):
            found.append(arg)
    return found


# Interpreters, and the flags that hand them a program on the command line.
_INLINE_CODE = {
    "python": {"-c"}, "python3": {"-c"}, "node": {"-e", "--eval", "-p", "--print"},
    "perl": {"-e", "-E"}, "ruby": {"-e"}, "php": {"-r"}, "lua": {"-e"},
    "bash": {"-c"}, "sh": {"-c"}, "zsh": {"-c"}, "dash": {"-c"}, "ksh": {"-c"},
}  # fmt: skip
# Variables that make a program run another program, or load code into it.
_EXEC_VARIABLE = re.compile(
    r"^(?:GIT_[A-Z_]+|[A-Z_]*EDITOR|[A-Z_]*PAGER|LD_[A-Z_]+|BASH_ENV|ENV|PYTHONSTARTUP|PYTHONPATH"
    r"|PERL5OPT|PERL5LIB|NODE_OPTIONS|RUBYOPT|PROMPT_COMMAND|SHELLOPTS|IFS|PATH)="
)
# git options that run a program or write a file named on the command line.
_GIT_EXEC_OPTIONS = (
    "--output", "--open-files-in-pager", "-O", "--ext-diff", "--exec", "--upload-pack",
    "--receive-pack", "--config-env", "--exec-path", "--git-dir", "--work-tree", "-C",
)  # fmt: skip
# Subcommands that change refs or the repository's state: only the runtime does that.
_GIT_REFS = {
    "add", "commit", "branch", "tag", "update-ref", "symbolic-ref", "reflog", "stash",
    "switch", "checkout", "reset", "rebase", "merge", "cherry-pick", "revert", "am", "apply",
    "pull", "fetch", "clean", "gc", "prune", "repack", "replace", "notes", "worktree",
    "filter-branch", "remote", "config", "submodule", "rm", "mv", "restore", "init", "clone",
    "maintenance", "bisect", "push",
}  # fmt: skip
_GIT_READ = {
    "status", "diff", "log", "show", "rev-parse", "ls-files", "ls-tree", "grep", "blame",
    "cat-file", "describe", "shortlog", "rev-list", "name-rev", "merge-base", "whatchanged",
    "diff-tree", "diff-files", "diff-index", "for-each-ref", "show-ref", "version", "help",
}  # fmt: skip


# Forms of the subcommands above that only read: listing stashes, remotes, tags, worktrees.
_GIT_READ_FORMS = {
    "stash": {"list", "show"}, "remote": {"-v", "--verbose", "show", "get-url"},
    "config": {"--get", "--get-all", "--get-regexp", "--list", "-l"},
    "tag": {"-l", "--list"}, "worktree": {"list"}, "submodule": {"status"},
    "notes": {"list", "show"}, "bisect": {"log", "visualize"},
}  # fmt: skip


def _git_reads(sub: str, rest: list[str]) -> bool:
    """Whether `git <sub> <rest>` only reads, for a subcommand that can also write."""
    if sub in {"remote", "tag"} and not rest:
        return True  # lists them (`git stash` alone stashes)
    return bool(rest) and rest[0] in _GIT_READ_FORMS.get(sub, set())


def _judge_git(text: str, args: list[str], policy: Policy) -> PartVerdict:
    for arg in args:
        if arg.startswith(_GIT_EXEC_OPTIONS) or arg == "-c" or arg.startswith("-c"):
            if arg.startswith(("--output", "-O", "--open-files-in-pager", "--ext-diff", "--exec")):
                return PartVerdict(
                    text, Tier.DANGER, f"git {arg.split('=')[0]} runs a program or writes a file"
                )
            if not policy.sandboxed:
                return PartVerdict(
                    text, Tier.CAUTION, f"git {arg.split('=')[0]} changes what git runs or reads"
                )
    # The subcommand: the first word that is neither an option nor an option's value.
    words: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in {"-c", "-C", "--git-dir", "--work-tree", "--namespace", "--exec-path"}:
            skip = True
        elif not arg.startswith("-") or words:
            words.append(arg)
    sub, rest = (words[0], words[1:]) if words else ("", [])
    if sub == "push" and (
        any(
            a in {"-f", "--force", "--force-with-lease", "--mirror", "--delete", "-d"} for a in args
        )
        or any(a.startswith(("+", "--force", ":")) for a in args[1:])
    ):
        return PartVerdict(text, Tier.DANGER, "force-push rewrites shared history")
    if sub == "branch" and any(
        a in {"-D", "-d", "-f", "--force", "-m", "-M", "-c", "-C", "--delete", "--move", "--copy"}
        or a.startswith(("--set-upstream", "-u"))
        for a in args
    ):
        return PartVerdict(text, Tier.DANGER, "deletes, moves or overwrites a branch")
    if sub in {"update-ref", "symbolic-ref", "filter-branch", "replace"}:
        return PartVerdict(text, Tier.DANGER, f"git {sub} rewrites refs")
    if sub in _GIT_READ or _git_reads(sub, rest):
        return PartVerdict(text, Tier.SAFE, "reads the repository")
    if sub == "branch" and not [a for a in rest if not a.startswith("-")]:
        return PartVerdict(text, Tier.SAFE, "lists branches")
    if sub in _GIT_REFS:
        return PartVerdict(
            text, Tier.CAUTION,
            f"git {sub}: the repository is read-only to agents; the runtime commits your "
            "changes when you finish",
        )  # fmt: skip
    if policy.sandboxed and not (sub in _NETWORK_GIT and policy.network):
        return PartVerdict(text, Tier.SAFE, f"git {sub}: held by the sandbox")
    return PartVerdict(text, Tier.CAUTION, f"git {sub or '(no subcommand)'}")


# git subcommands that reach another machine.
_NETWORK_GIT = {"ls-remote", "fetch", "pull", "push", "clone", "archive", "send-email"}
# Programs whose harm is reaching the network: held by a sandbox without one.
_NETWORK = {"curl", "wget", "ssh", "scp", "rsync", "nc", "ncat", "telnet", "ftp", "sftp"}
_INSTALLERS = {"npm", "pip", "pip3", "uv", "yarn", "pnpm", "poetry"}
# Cautions the sandbox does not make harmless, or that cannot work inside it.
_CAUTION_SANDBOXED = {"docker", "apt", "apt-get", "crontab"}


def _inline_script(prog: str, args: list[str]) -> str | None:
    """The program an interpreter was handed on its command line (`-c`, `-e` ...), or None."""
    flags = _INLINE_CODE.get(prog)
    if not flags:
        return None
    for index, arg in enumerate(args):
        if arg in flags or (
            arg.startswith("-")
            and not arg.startswith("--")
            and any(f[1:] in arg[1:] for f in flags if len(f) == 2)
        ):
            return args[index + 1] if index + 1 < len(args) else ""
    return None


def _held(text: str, tier: Tier, reason: str, policy: Policy) -> PartVerdict:
    """A caution the sandbox holds: allowed when the command runs in it."""
    if policy.sandboxed:
        return PartVerdict(text, Tier.SAFE, f"{reason} (held by the sandbox)")
    return PartVerdict(text, tier, reason)


def judge_part(part: Part, previous: Sequence[Part], policy: Policy = STRICT) -> PartVerdict:
    text = part.text
    for target in _WRITE_TARGET.findall(text):
        if _outside(target, policy):
            return PartVerdict(text, Tier.DANGER, f"writes outside the workspace ({target})")
    if re.search(r"/proc/[^/\s]+/(?:environ|mem|root|cwd|fd)\b", text):
        return PartVerdict(text, Tier.DANGER, "reads another process's environment or memory")
    try:
        tokens = shlex.split(text, comments=False)
    except ValueError:
        return PartVerdict(text, Tier.CAUTION, "cannot be parsed")
    assignments = []
    while tokens and _ASSIGNMENT.match(tokens[0]):
        assignments.append(tokens.pop(0))
    for assignment in assignments:
        # In the sandbox a variable changes only what runs in it.
        if tokens and _EXEC_VARIABLE.match(assignment) and not policy.sandboxed:
            name = assignment.split("=", 1)[0]
            return PartVerdict(text, Tier.DANGER, f"{name} makes the program run other code")
    if not tokens:
        return PartVerdict(text, Tier.SAFE, "assignment")
    prog, args = PurePosixPath(tokens[0]).name, tokens[1:]
    if (
        prog in {"exec", "command", "builtin", "nice", "nohup", "timeout", "stdbuf", "time"}
        and args
    ):
        # The program these run is the one to judge.
        rest = list(args)
        # Their own options and values (`nice -n 5`, `timeout -s KILL 5s`) come first.
        while rest and (rest[0].startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?", rest[0])):
            if rest.pop(0) in {"-n", "-s", "-k", "--signal", "--kill-after", "--adjustment"}:
                rest = rest[1:]
        if rest:
            return judge_part(Part(shlex.join(rest), part.piped), previous, policy)
    flags = "".join(a.lstrip("-") for a in args if a.startswith("-") and not a.startswith("--"))
    if prog == "eval" and policy.sandboxed:
        return PartVerdict(text, Tier.SAFE, "runs a string (held by the sandbox)")
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
        if any(_outside(t, policy) or t in {"*", ".", "./", "/*"} for t in targets) or not targets:
            return PartVerdict(text, Tier.DANGER, "recursive delete of the workspace or beyond")
    if prog == "dd" and any(a.startswith("of=/dev/") for a in args):
        return PartVerdict(text, Tier.DANGER, "writes a device")
    writers = {"cp", "mv", "tee", "touch", "mkdir", "ln", "install", "dd", "rm", "chmod",
               "chown", "truncate", "shred", "rsync", "tar", "unzip", "patch", "split", "csplit"}  # fmt: skip
    if prog in writers or (prog == "sed" and any(a.startswith(("-i", "--in-place")) for a in args)):
        for value in _values(a.split("=", 1)[1] if a.startswith("of=") else a for a in args):
            if _outside(value, policy):
                return PartVerdict(text, Tier.DANGER, f"writes outside the workspace ({value})")
    if prog == "sort":
        for i, arg in enumerate(args):
            target = args[i + 1] if arg == "-o" and i + 1 < len(args) else ""
            target = arg[2:] if arg.startswith("-o") and len(arg) > 2 else target
            target = arg.split("=", 1)[1] if arg.startswith("--output=") else target
            if target and _outside(target, policy):
                return PartVerdict(text, Tier.DANGER, f"writes outside the workspace ({target})")
    if prog == "find":
        acts = {"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprintf", "-fls"}
        if any(a in acts for a in args):
            roots = [a for a in args if not a.startswith(("-", "(", ")", "!"))][:1]
            if "-delete" in args and (not roots or any(_outside(r, policy) for r in roots)):
                return PartVerdict(text, Tier.DANGER, "deletes files outside the workspace")
            return _held(text, Tier.CAUTION, "find runs commands or writes files", policy)
    if prog in {"awk", "gawk", "mawk", "nawk"} and re.search(
        r"system\s*\(|\|\s*getline|getline\s*<|print[^;}]*[>|]", text
    ):
        return _held(text, Tier.CAUTION, "awk runs commands or writes files", policy)
    script = _inline_script(prog, args)
    if script is not None:
        if not policy.sandboxed:
            return PartVerdict(text, Tier.CAUTION, f"{prog} runs inline code")
        if prog in {"bash", "sh", "zsh", "dash", "ksh"}:
            # A shell's script is a command line like any other: judged the same way.
            inner = command_judge(script, policy=policy)
            if inner.parts:
                worst = max(inner.parts, key=lambda v: v.tier)
                return PartVerdict(text, worst.tier, f"{prog} -c: {worst.reason}")
        return PartVerdict(text, Tier.SAFE, f"{prog} runs inline code (held by the sandbox)")
    if prog == "git":
        return _judge_git(text, args, policy)
    if prog in _NETWORK:
        if policy.sandboxed and not policy.network:
            return PartVerdict(text, Tier.SAFE, "the sandbox has no network")
        return PartVerdict(text, Tier.CAUTION, _CAUTION.get(prog, "reaches the network"))
    if prog in _INSTALLERS and args[:1] in (["install"], ["add"], ["i"], ["sync"]):
        if policy.network and not any(a in {"--no-index", "--offline"} for a in args):
            return PartVerdict(text, Tier.CAUTION, "installs packages from the network")
        return _held(text, Tier.CAUTION, "installs packages", policy)
    if prog in _CAUTION:
        if prog in _CAUTION_SANDBOXED:
            return PartVerdict(text, Tier.CAUTION, _CAUTION[prog])
        return _held(text, Tier.CAUTION, _CAUTION[prog], policy)
    if prog in _SAFE:
        return PartVerdict(text, Tier.SAFE, "known safe program")
    return _held(text, Tier.CAUTION, f"{prog}: not a known safe program", policy)


def _prog(part: Part) -> str:
    try:
        tokens = shlex.split(part.text)
    except ValueError:
        return ""
    return PurePosixPath(tokens[0]).name if tokens else ""


# A shell function (`name() { ... }` or `function name { ... }`) whose body calls itself in a
# pipe or in the background: the fork bomb `:(){ :|:& };:` and its renamings.
_FUNCTION = re.compile(
    r"(?:\bfunction\s+([^\s(){};|&]+)\s*(?:\(\s*\))?|([^\s(){};|&]+)\s*\(\s*\))\s*\{(.*?)\}",
    re.DOTALL,
)


def _fork_bomb(command: str) -> bool:
    for match in _FUNCTION.finditer(command):
        name, body = match.group(1) or match.group(2), match.group(3)
        calls = re.findall(rf"(?:^|[\s;|&(]){re.escape(name)}(?=$|[\s;|&)])", body)
        if calls and ("&" in body or "|" in body or len(calls) > 1):
            return True
    return False


def _traumatic(verdict: PartVerdict, traumas: Sequence[tuple[str, str]]) -> PartVerdict:
    """The verdict escalated one tier when a trauma matches its text."""
    for pattern, why in traumas:
        try:
            found = re.search(pattern, verdict.text)
        except re.error:
            continue  # an operator's pattern that does not compile matches nothing
        if found:
            tier = Tier(min(verdict.tier + 1, Tier.DANGER))
            return PartVerdict(verdict.text, tier, f"{verdict.reason}; trauma: {why}")
    return verdict


def command_judge(
    command: str,
    *,
    allow: Sequence[str] = (),
    traumas: Sequence[tuple[str, str]] = (),
    policy: Policy = STRICT,
) -> Verdict:
    """Judge a whole command. `allow`: regexes allowing caution parts; `traumas`: (regex, why);
    `policy`: what holds the command besides the guard (STRICT: nothing)."""
    if "\x00" in command:
        return Verdict(False, Tier.DANGER, "refused (danger): a NUL byte in the command", ())
    if _fork_bomb(command):
        bomb = PartVerdict(command, Tier.DANGER, "fork bomb")
        return Verdict(False, Tier.DANGER, f"refused (danger): {command!r}: fork bomb", (bomb,))
    parts = split_command(command)
    if not parts:
        return Verdict(False, Tier.CAUTION, "empty command", ())
    verdicts = [
        _traumatic(judge_part(part, parts[:index], policy), traumas)
        for index, part in enumerate(parts)
    ]
    if len(parts) > 1:
        # A trauma recorded for a whole compound command matches it, not any of its parts.
        whole = _traumatic(
            PartVerdict(command.strip(), max(v.tier for v in verdicts), "the whole command"),
            traumas,
        )
        if whole.tier > max(v.tier for v in verdicts):
            verdicts.append(whole)
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
