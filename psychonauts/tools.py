"""The tool registry: each tool has a JSON schema its arguments are validated against.

Tools raise ToolFailure (or a subclass) to refuse; `tool_execute` turns refusals, bad arguments
and unknown tools into an error result for the model — never a crash of the run.
Other apps add tools with `tool_register` from their AppConfig.ready(): the tether app registers
`ask_tether` (raising SuspendRun to wait without a worker) and `propose_pipeline_change`.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from psychonauts import leases
from psychonauts.errors import CommandRefused, ToolFailure
from psychonauts.guard import command_judge
from psychonauts.models import CommandTrauma, DiaryEntry, DiaryKind, Mail
from psychonauts.providers.base import ToolSpec
from psychonauts.schema import schema_errors
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
    try:
        return ToolResult(truncate(tool.handler(ctx, args)), False)
    except ToolFailure as exc:
        return ToolResult(f"{name} refused: {exc}", True)
    except OSError as exc:
        return ToolResult(f"{name} failed: {exc.strerror or exc}", True)


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_PATH = {"type": "string", "minLength": 1, "description": "relative to the workspace"}


def _read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_path(ctx.workspace, args["path"])
    if not path.is_file():
        raise ToolFailure(f"{args['path']}: no such file")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    offset, limit = args.get("offset", 0), args.get("limit", 2000)
    return "".join(lines[offset : offset + limit])


def _check_write(ctx: ToolContext, rel: str) -> Path:
    path = resolve_path(ctx.workspace, rel)
    if ctx.shared:
        leases.lease_require_exclusive(
            workspace=str(ctx.workspace), path=str(path.relative_to(ctx.workspace.resolve())),
            holder=ctx.holder,
        )  # fmt: skip
    return path


def _write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _check_write(ctx, args["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(args["content"], encoding="utf-8")
    return f"wrote {len(args['content'])} characters to {args['path']}"


def _edit_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _check_write(ctx, args["path"])
    if not path.is_file():
        raise ToolFailure(f"{args['path']}: no such file")
    text = path.read_text(encoding="utf-8")
    count = text.count(args["old"])
    if count == 0:
        raise ToolFailure(f"{args['path']}: the text to replace was not found")
    if count > 1:
        raise ToolFailure(
            f"{args['path']}: the text to replace is ambiguous ({count} matches); "
            "include more surrounding text"
        )
    path.write_text(text.replace(args["old"], args["new"], 1), encoding="utf-8")
    return f"edited {args['path']}"


def _list_dir(ctx: ToolContext, args: dict[str, Any]) -> str:
    rel = args.get("path", ".")
    path = ctx.workspace.resolve() if rel in {".", ""} else resolve_path(ctx.workspace, rel)
    if not path.is_dir():
        raise ToolFailure(f"{rel}: not a folder")
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir() if p.name != ".git")
    return "\n".join(names) or "(empty)"


def _walk(ctx: ToolContext) -> list[str]:
    root = ctx.workspace.resolve()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
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
    try:
        regex = re.compile(args["pattern"])
    except re.error as exc:
        raise ToolFailure(f"bad regular expression: {exc}") from None
    only = args.get("glob", "*")
    hits: list[str] = []
    for rel in _walk(ctx):
        if not fnmatch.fnmatch(rel, only):
            continue
        try:
            text = (ctx.workspace / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line):
                hits.append(f"{rel}:{number}: {line}")
                if len(hits) >= 500:
                    return "\n".join(hits) + "\n(500 matches shown)"
    return "\n".join(hits) or "(no match)"


def command_check(command: str) -> None:
    traumas = [(t.pattern, t.reason) for t in CommandTrauma.objects.filter(active=True)]
    verdict = command_judge(command, allow=settings.PSYCHONAUTS_COMMAND_ALLOW, traumas=traumas)
    if not verdict.allowed:
        raise CommandRefused(verdict.reason)


def _shell(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = args["command"]
    command_check(command)
    timeout = min(args.get("timeout_s", settings.PSYCHONAUTS_SHELL_TIMEOUT_S),
                  settings.PSYCHONAUTS_SHELL_TIMEOUT_S)  # fmt: skip
    # A clean environment: the agent's commands never see our secrets (API keys, DB URLs).
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(ctx.workspace),
        "LANG": "C.UTF-8",
        "ANNIHILATION_AGENT": ctx.agent_id,
    }
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=ctx.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")
        )
        raise ToolFailure(f"timed out after {timeout:.0f}s\n{truncate(out)}") from None
    elapsed = time.monotonic() - started
    output = (proc.stdout or "") + (f"\n[stderr]\n{proc.stderr}" if proc.stderr else "")
    return f"exit {proc.returncode} ({elapsed:.1f}s)\n{truncate(output)}"


def _diary(ctx: ToolContext, args: dict[str, Any]) -> str:
    DiaryEntry.objects.create(agent_run_id=ctx.agent_run_id, kind=args["kind"], text=args["text"])
    return f"noted ({args['kind']})"


def _mail_send(ctx: ToolContext, args: dict[str, Any]) -> str:
    mail = Mail.objects.create(
        sender=ctx.agent_id,
        recipient=args["to"],
        quantum_id=ctx.quantum_id,
        subject=args.get("subject", ""),
        body=args["body"],
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
    if "role" in args:
        specs = [{"role": args["role"], "task": args.get("task", "")}, *specs]
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
         _obj({"to": {"type": "string", "minLength": 1}, "subject": _STR,
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
):  # fmt: skip
    tool_register(_tool)
