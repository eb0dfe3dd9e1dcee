"""The tool registry: each tool has a JSON schema its arguments are validated against.

Tools raise ToolFailure (or a subclass) to refuse; `tool_execute` turns refusals, bad arguments
and unknown tools into an error result for the model — never a crash of the run.
Other apps add tools with `tool_register` from their AppConfig.ready(): the tether app registers
`ask_tether` (raising SuspendRun to wait without a worker) and `propose_pipeline_change`.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import regex
from django.conf import settings
from django.utils import timezone

from core.redaction import redact
from core.safetext import text_problem
from psychonauts import leases
from psychonauts.diary import diary_add
from psychonauts.errors import CommandRefused, PathEscape, ToolFailure
from psychonauts.guard import Tier, command_judge
from psychonauts.models import CommandTrauma, DiaryKind, Mail
from psychonauts.providers.base import ContentBlock, ToolSpec
from psychonauts.sandbox import SandboxResult, SandboxUnavailable, path_own, sandbox_run
from psychonauts.schema import schema_errors
from psychonauts.traumas import trauma_record
from psychonauts.workspaces import resolve_path

SpawnSpec = dict[str, str]
SpawnFn = Callable[[list[SpawnSpec]], str]


@dataclass
class ToolContext:
    agent_run_id: int
    agent_id: str
    attempt: int
    quantum_id: int
    role: str
    depth: int
    workspace: Path
    shared: bool
    turn_index: int = 0
    tool_use_id: str = ""
    spawn: SpawnFn | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def holder(self) -> str:
        return f"{self.agent_id}#{self.attempt}"


Handler = Callable[[ToolContext, dict[str, Any]], str]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    handler: Handler
    # False: the tool cannot change the agent's workspace (it reads, or writes only rows). An
    # agent that called no other tool has nothing to commit: its end runs no git.
    changes_workspace: bool = True

    def spec(self) -> ToolSpec:
        return {"name": self.name, "description": self.description, "input_schema": self.schema}


TOOLS: dict[str, Tool] = {}


def tool_register(tool: Tool) -> None:
    TOOLS[tool.name] = tool


def tools_for(allowed: list[str]) -> list[Tool]:
    """The role's tools (all registered ones when the role lists none)."""
    if not allowed:
        return list(TOOLS.values())
    return [TOOLS[name] for name in allowed if name in TOOLS]


def calls_change_workspace(blocks: list[ContentBlock]) -> bool:
    """Whether a reply's tool calls include one that can change the workspace. A tool not
    registered here counts: it may belong to an app this process did not load."""
    for block in blocks:
        if block.get("type") == "tool_use":
            tool = TOOLS.get(str(block.get("name", "")))
            if tool is None or tool.changes_workspace:
                return True
    return False


@dataclass(frozen=True)
class ToolResult:
    output: str
    is_error: bool


def truncate(text: str, limit: int | None = None) -> str:
    limit = limit or settings.PSYCHONAUTS_OUTPUT_LIMIT
    if len(text) <= limit:
        return text
    return (
        text[: limit // 2] + f"\n… [{len(text) - limit} characters cut] …\n" + text[-limit // 2 :]
    )


def tool_execute(ctx: ToolContext, name: str, args: Any, allowed: list[str]) -> ToolResult:
    tool = TOOLS.get(name)
    if tool is None or (allowed and name not in allowed):
        known = ", ".join(t.name for t in tools_for(allowed))
        return ToolResult(f"unknown tool {name!r}; available: {known}", True)
    errors = schema_errors(args, tool.schema)
    if errors:
        return ToolResult(f"invalid arguments for {name}: " + "; ".join(errors), True)
    # Redacted before the model, the database, the events or a terminal see it: a secret an
    # agent's command prints never leaves the worker.
    try:
        return ToolResult(truncate(redact(tool.handler(ctx, args))), False)
    except (ToolFailure, SandboxUnavailable) as exc:
        return ToolResult(truncate(redact(f"{name} refused: {exc}")), True)
    except OSError as exc:
        return ToolResult(redact(f"{name} failed: {exc.strerror or exc}"), True)


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_PATH = {"type": "string", "minLength": 1, "description": "relative to the workspace"}


# Files are opened one path step at a time below the workspace's own folder, never following
# a link: a link (or a folder swapped for one by a command running meanwhile) cannot lead the
# runtime, which runs outside the sandbox, anywhere else.
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# The most of a file read_file and grep read.
READ_LIMIT = 16 * 2**20


def _open_beneath(
    ctx: ToolContext, rel: str, flags: int, *, make_parents: bool = False
) -> tuple[int, Path]:
    """A file descriptor for `rel` in the workspace, and its path (PathEscape for a link)."""
    path = resolve_path(ctx.workspace, rel)
    root = ctx.workspace.resolve()
    parts = path.relative_to(root).parts
    if not parts:
        raise ToolFailure(f"{rel}: a folder, not a file")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        step = root
        for part in parts[:-1]:
            step = step / part
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not make_parents:
                    raise ToolFailure(f"{rel}: no such file") from None
                os.mkdir(part, 0o755, dir_fd=fd)
                path_own(step, quantum_id=ctx.quantum_id)
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(part, fd)):
                    raise PathEscape(f"{rel}: a link on the way") from None
                if exc.errno == errno.ENOTDIR:
                    raise ToolFailure(f"{rel}: no such file") from None
                raise
            os.close(fd)
            fd = inner
        try:
            # O_NONBLOCK: a FIFO an agent made fails at once instead of holding the worker
            # (it changes nothing for a regular file).
            return os.open(parts[-1], flags | _NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd), path
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathEscape(f"{rel}: is a link; read its target instead") from None
            if exc.errno == errno.ENOENT:
                raise ToolFailure(f"{rel}: no such file") from None
            if exc.errno == errno.ENXIO:
                raise ToolFailure(f"{rel}: not a regular file") from None
            raise
    finally:
        os.close(fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _read_text(ctx: ToolContext, rel: str, *, strict: bool = False) -> str:
    fd, _ = _open_beneath(ctx, rel, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ToolFailure(f"{rel}: not a regular file")
        data = handle.read(READ_LIMIT + 1)
    if len(data) > READ_LIMIT:
        raise ToolFailure(
            f"{rel}: larger than {READ_LIMIT // 2**20} MiB; use the shell to look at parts of it"
        )
    return data.decode("utf-8", errors="strict" if strict else "replace")


def _write_text(ctx: ToolContext, rel: str, text: str) -> None:
    fd, path = _open_beneath(ctx, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ToolFailure(f"{rel}: not a regular file")
        handle.write(text)
    path_own(path, quantum_id=ctx.quantum_id)


def _read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    lines = _read_text(ctx, args["path"]).splitlines(keepends=True)
    offset, limit = args.get("offset", 0), args.get("limit", 2000)
    return "".join(lines[offset : offset + limit])


def _check_write(ctx: ToolContext, rel: str) -> None:
    """In the shared tree, the writer must hold the file's lease."""
    if not ctx.shared:
        return
    path = resolve_path(ctx.workspace, rel)
    leases.lease_require_exclusive(
        workspace=str(ctx.workspace), path=str(path.relative_to(ctx.workspace.resolve())),
        holder=ctx.holder,
    )  # fmt: skip


def _write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    _check_write(ctx, args["path"])
    _write_text(ctx, args["path"], args["content"])
    return f"wrote {len(args['content'])} characters to {args['path']}"


def _edit_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    _check_write(ctx, args["path"])
    try:
        text = _read_text(ctx, args["path"], strict=True)
    except UnicodeDecodeError:
        raise ToolFailure(f"{args['path']}: not UTF-8 text") from None
    count = text.count(args["old"])
    if count == 0:
        raise ToolFailure(f"{args['path']}: the text to replace was not found")
    if count > 1:
        raise ToolFailure(
            f"{args['path']}: the text to replace is ambiguous ({count} matches); "
            "include more surrounding text"
        )
    _write_text(ctx, args["path"], text.replace(args["old"], args["new"], 1))
    return f"edited {args['path']}"


def _list_dir(ctx: ToolContext, args: dict[str, Any]) -> str:
    rel = args.get("path", ".")
    path = ctx.workspace.resolve() if rel in {".", ""} else resolve_path(ctx.workspace, rel)
    if not path.is_dir():
        raise ToolFailure(f"{rel}: not a folder")
    names = []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name == ".git":
                continue
            kind = "@" if entry.is_symlink() else "/" if entry.is_dir() else ""
            names.append(entry.name + kind)
    return "\n".join(sorted(names)) or "(empty)"


def _walk(ctx: ToolContext) -> list[str]:
    """Every file of the workspace, links included as names (never followed: os.walk does not
    enter a linked folder)."""
    root = ctx.workspace.resolve()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git" and not (Path(folder) / d).is_symlink()]
        for name in files:
            found.append(str((Path(folder) / name).relative_to(root)))
    return sorted(found)


def _glob(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = args["pattern"]
    if pattern.startswith("/") or ".." in Path(pattern).parts:
        raise ToolFailure(f"{pattern!r}: patterns stay inside the workspace")
    matches = [p for p in _walk(ctx) if fnmatch.fnmatch(p, pattern)]
    return "\n".join(matches[:1000]) or "(no match)"


def _grep(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Python's regular expressions, with a time limit on the whole search: a pattern that
    backtracks catastrophically fails the call instead of holding the worker."""
    try:
        pattern = regex.compile(args["pattern"])
    except (regex.error, OverflowError, ValueError) as exc:
        raise ToolFailure(f"bad regular expression: {exc}") from None
    only = args.get("glob", "*")
    deadline = time.monotonic() + settings.PSYCHONAUTS_GREP_TIMEOUT_S
    hits: list[str] = []
    for rel in _walk(ctx):
        if not fnmatch.fnmatch(rel, only):
            continue
        try:
            text = _read_text(ctx, rel, strict=True)
        except (UnicodeDecodeError, OSError, ToolFailure):
            continue  # binary, unreadable, too large, or a link
        for number, line in enumerate(text.splitlines(), 1):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                found = pattern.search(line, timeout=left)
            except TimeoutError:
                raise ToolFailure(
                    f"the search took longer than {settings.PSYCHONAUTS_GREP_TIMEOUT_S:g}s "
                    "(simplify the expression or narrow the glob)"
                ) from None
            if found:
                hits.append(f"{rel}:{number}: {line}")
                if len(hits) >= 500:
                    return "\n".join(hits) + "\n(500 matches shown)"
    return "\n".join(hits) or "(no match)"


def command_check(ctx: ToolContext, command: str) -> None:
    """The guard's verdict; a refused danger is recorded as a trauma."""
    traumas = [(t.pattern, t.reason) for t in CommandTrauma.objects.filter(active=True)]
    verdict = command_judge(command, allow=settings.PSYCHONAUTS_COMMAND_ALLOW, traumas=traumas)
    if verdict.allowed:
        return
    if verdict.tier == Tier.DANGER:
        worst = max(verdict.parts, key=lambda v: v.tier)
        trauma_record(
            pattern=re.escape(worst.text), reason=f"refused: {worst.reason}",
            source="guard", agent_id=ctx.agent_id,
        )  # fmt: skip
    raise CommandRefused(verdict.reason)


# What a command's end says about a sandbox boundary it ran into.
_VIOLATIONS = (
    (re.compile(r"Read-only file system"), "wrote outside its workspace"),
    (re.compile(r"fork: (?:retry: )?Resource temporarily unavailable|Cannot fork"),
     "hit the process limit"),
    (re.compile(r"Cannot allocate memory|MemoryError|std::bad_alloc|out of memory"),
     "hit the memory limit"),
)  # fmt: skip


def _violation(result: SandboxResult) -> str:
    """The boundary a command ran into, or "". Running out of time is not one: a slow test
    suite is no incident, and a trauma would refuse it from then on."""
    if result.stopped == "output":
        return "printed more than the output limit"
    for pattern, what in _VIOLATIONS:
        if pattern.search(result.stderr) or pattern.search(result.stdout):
            return what
    return ""


def _shell(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = args["command"]
    command_check(ctx, command)
    timeout = min(args.get("timeout_s", settings.PSYCHONAUTS_SHELL_TIMEOUT_S),
                  settings.PSYCHONAUTS_SHELL_TIMEOUT_S)  # fmt: skip
    result = sandbox_run(
        command,
        workspace=ctx.workspace,
        quantum_id=0 if ctx.shared else ctx.quantum_id,
        timeout_s=timeout,
        env={"ANNIHILATION_AGENT": ctx.agent_id},
    )
    violation = _violation(result) if result.sandboxed else ""
    if violation:
        trauma_record(pattern=re.escape(command), reason=f"sandbox: {violation}",
                      source="sandbox", agent_id=ctx.agent_id)  # fmt: skip
    if result.stopped == "timeout":
        raise ToolFailure(
            f"timed out after {timeout:.0f}s and was killed\n{truncate(result.output)}"
        )
    if result.stopped == "output":
        raise ToolFailure(
            f"printed more than {settings.SANDBOX_OUTPUT_BYTES // 1024} KiB and was killed\n"
            f"{truncate(result.output)}"
        )
    note = f"; sandbox: {violation}" if violation else ""
    return f"exit {result.returncode} ({result.elapsed_s:.1f}s{note})\n{truncate(result.output)}"


def _diary(ctx: ToolContext, args: dict[str, Any]) -> str:
    diary_add(agent_run_id=ctx.agent_run_id, kind=args["kind"], text=args["text"])
    return f"noted ({args['kind']})"


def _mail_send(ctx: ToolContext, args: dict[str, Any]) -> str:
    mail = Mail.objects.create(
        sender=ctx.agent_id,
        recipient=args["to"],
        quantum_id=ctx.quantum_id,
        subject=redact(args.get("subject", "")),
        body=redact(args["body"]),
    )
    return f"sent mail {mail.pk} to {args['to']}"


def _mail_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    unread = list(
        Mail.objects.filter(recipient__in=[ctx.agent_id, ctx.role], read_at=None).order_by(
            "created_at"
        )[:50]
    )
    Mail.objects.filter(pk__in=[m.pk for m in unread]).update(read_at=timezone.now())
    if not unread:
        return "(no new mail)"
    return "\n\n".join(f"From {m.sender}: {m.subject}\n{m.body}" for m in unread)


def _spawn(ctx: ToolContext, args: dict[str, Any]) -> str:
    if ctx.spawn is None:
        raise ToolFailure("spawning is not available here")
    specs = args.get("agents") or []
    if ("role" in args or "task" in args) and specs:
        # Which did the model mean, one agent or the list? Running both starts agents nobody
        # asked for.
        raise ToolFailure(
            "ambiguous: give either `role` and `task` (one sub-agent) or `agents` (several), "
            "not both; nothing was started"
        )
    if "role" in args:
        specs = [{"role": args["role"], "task": args.get("task", "")}]
    if not specs:
        raise ToolFailure("name a `role` and `task`, or a list of `agents`")
    return ctx.spawn(specs)


def _lease_acquire(ctx: ToolContext, args: dict[str, Any]) -> str:
    if not ctx.shared:
        return "leases are only needed in the shared-tree mode; you have your own worktree"
    path = resolve_path(ctx.workspace, args["path"]).relative_to(ctx.workspace.resolve())
    mode = args.get("mode", "exclusive")
    leases.lease_acquire(workspace=str(ctx.workspace), path=str(path), holder=ctx.holder, mode=mode)
    return f"leased {path} ({mode})"


def _lease_release(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_path(ctx.workspace, args["path"]).relative_to(ctx.workspace.resolve())
    leases.lease_release(workspace=str(ctx.workspace), path=str(path), holder=ctx.holder)
    return f"released {path}"


# The verdict tool: its call is the verdict (the runtime reads the last successful one when the
# agent ends, `psychonauts.services.verification.verdict_find`); the handler only checks it.
VERDICT_TOOL = "report_verdict"
VERDICTS = ("pass", "fail")
VERDICT_REASONS_MAX = 8000  # characters: a review's findings, not a transcript


def _report_verdict(ctx: ToolContext, args: dict[str, Any]) -> str:
    reasons = args["reasons"]
    if not reasons.strip():
        raise ToolFailure("reasons: must not be blank; say why, with files and lines")
    problem = text_problem(reasons)
    if problem is not None:
        raise ToolFailure(f"reasons: {problem}")
    return (
        f"verdict recorded: {args['verdict']}. End your turn now with a short summary "
        f"(calling {VERDICT_TOOL} again replaces this verdict)."
    )


# The built-in tools that cannot change the workspace: they read it, or write only rows.
_READERS = frozenset(
    {"read_file", "list_dir", "glob", "grep", "diary", "mail_send", "mail_read", "lease_acquire",
     "lease_release", VERDICT_TOOL}
)  # fmt: skip
_SPAWN_ITEM = _obj({"role": {"type": "string", "minLength": 1}, "task": _STR}, ["role", "task"])

for _tool in (
    Tool("read_file", "Read a text file (optionally a range of lines).",
         _obj({"path": _PATH, "offset": {"type": "integer", "minimum": 0},
               "limit": {"type": "integer", "minimum": 1}}, ["path"]), _read_file),
    Tool("write_file", "Create or overwrite a file.",
         _obj({"path": _PATH, "content": _STR}, ["path", "content"]), _write_file),
    Tool("edit_file", "Replace one exact, unique occurrence of `old` with `new`.",
         _obj({"path": _PATH, "old": {"type": "string", "minLength": 1}, "new": _STR},
              ["path", "old", "new"]), _edit_file),
    Tool("list_dir", "List a folder of the workspace.", _obj({"path": _STR}, []), _list_dir),
    Tool("glob", "Files matching a glob pattern (e.g. `**/*.py`).",
         _obj({"pattern": {"type": "string", "minLength": 1}}, ["pattern"]), _glob),
    Tool("grep", "Lines matching a regular expression, as path:line: text.",
         _obj({"pattern": {"type": "string", "minLength": 1}, "glob": _STR}, ["pattern"]), _grep),
    Tool("shell", "Run a shell command in the workspace (judged by the command guard).",
         _obj({"command": {"type": "string", "minLength": 1},
               "timeout_s": {"type": "number", "minimum": 1}}, ["command"]), _shell),
    Tool("diary", "Note an accomplishment, decision, challenge or learning.",
         _obj({"kind": {"type": "string", "enum": DiaryKind.values},
               "text": {"type": "string", "minLength": 1}}, ["kind", "text"]), _diary),
    Tool("mail_send", "Send a message to another agent (agent id or role).",
         _obj({"to": {"type": "string", "minLength": 1, "maxLength": 200},
               "subject": {"type": "string", "maxLength": 300},
               "body": {"type": "string", "minLength": 1}}, ["to", "body"]), _mail_send),
    Tool("mail_read", "Read (and mark read) your unread messages.", _obj({}, []), _mail_read),
    Tool("spawn", "Run sub-agents (one `role`+`task`, or several `agents` at once) and get "
         "their results.",
         _obj({"role": _STR, "task": _STR, "agents": {"type": "array", "items": _SPAWN_ITEM,
               "maxItems": 16}}, []), _spawn),
    Tool("lease_acquire", "Lease a file before writing it (shared-tree mode).",
         _obj({"path": _PATH, "mode": {"type": "string", "enum": ["exclusive", "shared_read"]}},
              ["path"]), _lease_acquire),
    Tool("lease_release", "Release a file lease.", _obj({"path": _PATH}, ["path"]),
         _lease_release),
    Tool(VERDICT_TOOL, "Your verdict on the change, as your last call before your final answer: "
         "`pass` or `fail`, with the reasons (for `fail`, each problem with file, line and the "
         "fix: they go back to the implementer).",
         _obj({"verdict": {"type": "string", "enum": list(VERDICTS)},
               "reasons": {"type": "string", "minLength": 1, "maxLength": VERDICT_REASONS_MAX}},
              ["verdict", "reasons"]), _report_verdict),
):  # fmt: skip
    tool_register(replace(_tool, changes_workspace=_tool.name not in _READERS))
