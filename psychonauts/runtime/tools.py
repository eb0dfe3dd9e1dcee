"""The tool registry: each tool has a JSON schema its arguments are validated against.

Tools raise ToolFailure (or a subclass) to refuse; `tool_execute` turns refusals, bad arguments
and unknown tools into an error result for the model — never a crash of the run.
Other apps add tools with `TOOLS.register` from their hooks.py: the tether app registers
`ask_tether` (raising SuspendRun to wait without a worker) and `propose_pipeline_change`.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import stat
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import regex
from django.conf import settings
from django.db import connection
from django.utils import timezone

from core.hooks import Hook
from core.redaction import redact
from core.safetext import text_problem
from core.sql import sql_names
from psychonauts.containment.guard import Policy, Tier, command_judge
from psychonauts.containment.identities import SHARED_TREE
from psychonauts.containment.sandbox import (
    SandboxEnvironment,
    SandboxResult,
    SandboxUnavailable,
    sandbox_run,
    sandbox_uid,
)
from psychonauts.containment.traumas import trauma_pattern, trauma_record, traumas_for
from psychonauts.errors import CommandRefused, PathEscape, ToolFailure
from psychonauts.models import DiaryKind, Mail
from psychonauts.routing.providers.base import ContentBlock, ToolSpec
from psychonauts.runtime import leases
from psychonauts.runtime.diary import diary_add
from psychonauts.runtime.schema import schema_errors

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
    # The repository's environment its commands run in (None: the system's programs only).
    environment: SandboxEnvironment | None = None

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


# Every tool an agent may be given, by name: the runtime's own, and those apps above register.
TOOLS: Hook[Tool] = Hook("psychonauts.runtime.tools", key=lambda tool: tool.name)


def tools_for(allowed: list[str]) -> list[Tool]:
    """The role's tools (all registered ones when the role lists none)."""
    if not allowed:
        return list(TOOLS)
    return [tool for name in allowed if (tool := TOOLS.get(name)) is not None]


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


# Files are reached only through descriptors opened one path step at a time below the
# workspace's own folder, never following a link, and every later step (reading, writing,
# ownership, listing, walking) acts on those descriptors: no path string is resolved again. A
# sibling agent's command that swaps a folder for a link meanwhile cannot lead the runtime, which
# runs outside the sandbox, anywhere else.
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
# The most of a file read_file and grep read.
READ_LIMIT = 16 * 2**20
# How deep glob and grep walk (each level holds a descriptor open).
WALK_DEPTH = 64


def _parts(rel: str) -> tuple[str, ...]:
    """`rel`'s steps below the workspace (PathEscape for absolute paths, `..` and .git)."""
    if not rel or rel.startswith(("/", "~")) or "\x00" in rel:
        raise PathEscape(f"{rel!r}: use a path relative to the workspace")
    parts = tuple(p for p in PurePosixPath(rel).parts if p != ".")
    if ".." in parts:
        raise PathEscape(f"{rel!r}: `..` leaves the workspace")
    if parts and parts[0] == ".git":
        raise PathEscape(f"{rel!r}: the .git folder is off limits")
    return parts


def _root_fd(ctx: ToolContext) -> int:
    # The workspace's own path is the runtime's (no agent can change what leads to it).
    return os.open(ctx.workspace.resolve(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _sandbox_user(ctx: ToolContext) -> int | None:
    """The uid the agent's commands run as, when it is not the worker's own (in the shared
    tree, one for every agent: `_shell`)."""
    if settings.SANDBOX_MODE == "off":
        return None
    return sandbox_uid(SHARED_TREE if ctx.shared else ctx.quantum_id)


def _own(fd: int, ctx: ToolContext) -> None:
    """What the runtime created in a workspace becomes the quantum's sandbox user's: by its
    descriptor, so it is that file and no other."""
    uid = _sandbox_user(ctx)
    if uid is not None:
        os.fchown(fd, uid, uid)


# How many links inside the workspace one path may pass through.
LINK_HOPS = 40


class _Link(Exception):
    """A folder step that is a link: a signal inside _open_dir, not an error."""

    def __init__(self, target: str) -> None:
        self.target = target


def _step(fd: int, part: str, rel: str) -> int:
    """The folder `part` of the folder `fd`, opened without following a link (_Link with its
    target when it is one)."""
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                target = os.readlink(part, dir_fd=fd)
            except OSError:
                target = None
            if target is not None:
                raise _Link(target) from None
        if exc.errno in (errno.ENOTDIR, errno.ENOENT):
            raise ToolFailure(f"{rel}: no such file or folder") from None
        raise


def _through_link(
    ctx: ToolContext, done: tuple[str, ...], target: str, rest: tuple[str, ...], rel: str
) -> tuple[str, ...]:
    """The steps below the workspace a folder link at `done` leads to, followed by `rest`
    (PathEscape when it leads out of the workspace or into .git)."""
    if target.startswith("/"):
        root = ctx.workspace.resolve()
        if not PurePosixPath(target).is_relative_to(root):
            raise PathEscape(f"{rel}: a link on the way leads outside the workspace")
        base: list[str] = []
        steps = PurePosixPath(target).relative_to(root).parts
    else:
        base, steps = list(done[:-1]), PurePosixPath(target).parts
    for step in (*steps, *rest):
        if step == "..":
            if not base:
                raise PathEscape(f"{rel}: a link on the way leads outside the workspace")
            base.pop()
        elif step not in {".", ""}:
            base.append(step)
    if base and base[0] == ".git":
        raise PathEscape(f"{rel}: a link on the way leads into the .git folder")
    return tuple(base)


def _open_dir(ctx: ToolContext, parts: tuple[str, ...], rel: str, *, make: bool = False) -> int:
    """A descriptor for the folder `parts` below the workspace (made, with its parents, when
    `make`). A link to a folder inside the workspace is followed by reading it and walking again
    from the workspace's root, one step at a time: never by handing the kernel a path."""
    return _open_dir_where(ctx, parts, rel, make=make)[0]


def _open_dir_where(
    ctx: ToolContext, parts: tuple[str, ...], rel: str, *, make: bool = False
) -> tuple[int, tuple[str, ...]]:
    """_open_dir, and the steps the folder was reached by once links were followed."""
    for _ in range(LINK_HOPS):
        fd, walked = _root_fd(ctx), 0
        try:
            for part in parts:
                walked += 1
                made = False
                if make:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        made = True
                    except FileExistsError:
                        pass
                inner = _step(fd, part, rel)
                if made:
                    _own(inner, ctx)
                os.close(fd)
                fd = inner
            return fd, parts
        except _Link as link:
            os.close(fd)
            parts = _through_link(ctx, parts[:walked], link.target, parts[walked:], rel)
        except BaseException:
            os.close(fd)
            raise
    raise PathEscape(f"{rel}: more than {LINK_HOPS} links on the way")


def _open_file(ctx: ToolContext, dir_fd: int, name: str, flags: int, rel: str) -> int:
    """A regular file `name` of the folder `dir_fd`: never a link, a FIFO or a device, and never
    a file with another name (a hard link) the sandbox user does not own."""
    try:
        # O_NONBLOCK: a FIFO an agent made fails at once instead of holding the worker (it
        # changes nothing for a regular file).
        fd = os.open(name, flags | _NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathEscape(f"{rel}: is a link; read its target instead") from None
        if exc.errno == errno.ENOENT:
            raise ToolFailure(f"{rel}: no such file") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise ToolFailure(f"{rel}: not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolFailure(f"{rel}: not a regular file")
        uid = _sandbox_user(ctx)
        if st.st_nlink > 1 and uid is not None and st.st_uid != uid:
            # A hard link can name a file of anyone's elsewhere on the same file system: the
            # runtime (root) would read or hand over a file the sandbox user cannot reach.
            raise PathEscape(f"{rel}: a hard link to a file that is not the workspace's")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_beneath(ctx: ToolContext, rel: str, flags: int, *, make_parents: bool = False) -> int:
    """A descriptor for the regular file `rel` of the workspace (PathEscape for a link)."""
    parts = _parts(rel)
    if not parts:
        raise ToolFailure(f"{rel}: a folder, not a file")
    try:
        dir_fd = _open_dir(ctx, parts[:-1], rel, make=make_parents)
    except ToolFailure as exc:
        if isinstance(exc, PathEscape):
            raise
        raise ToolFailure(f"{rel}: no such file") from None
    try:
        return _open_file(ctx, dir_fd, parts[-1], flags, rel)
    finally:
        os.close(dir_fd)


def _read_fd(fd: int, rel: str, *, strict: bool) -> str:
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(READ_LIMIT + 1)
    if len(data) > READ_LIMIT:
        raise ToolFailure(
            f"{rel}: larger than {READ_LIMIT // 2**20} MiB; use the shell to look at parts of it"
        )
    return data.decode("utf-8", errors="strict" if strict else "replace")


def _read_text(ctx: ToolContext, rel: str, *, strict: bool = False) -> str:
    return _read_fd(_open_beneath(ctx, rel, os.O_RDONLY), rel, strict=strict)


def _write_text(ctx: ToolContext, rel: str, text: str) -> None:
    # Truncated only once the descriptor is known to be a regular file of the workspace's.
    fd = _open_beneath(ctx, rel, os.O_WRONLY | os.O_CREAT, make_parents=True)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.truncate(0)
        handle.write(text)
        handle.flush()
        _own(handle.fileno(), ctx)


def _read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    lines = _read_text(ctx, args["path"]).splitlines(keepends=True)
    offset, limit = args.get("offset", 0), args.get("limit", 2000)
    return "".join(lines[offset : offset + limit])


def _lease_key(ctx: ToolContext, rel: str) -> str:
    """The name a lease knows a file by: its steps below the workspace, with the folder links
    on the way followed (two names of one file share one lease)."""
    parts = _parts(rel)
    if not parts:
        raise ToolFailure(f"{rel!r}: name a file")
    try:
        fd, folder = _open_dir_where(ctx, parts[:-1], rel)
    except PathEscape:
        raise
    except ToolFailure:
        return "/".join(parts)  # its folder does not exist yet: no link on the way either
    os.close(fd)
    return "/".join((*folder, parts[-1]))


def _check_write(ctx: ToolContext, rel: str) -> None:
    """In the shared tree, the writer must hold the file's lease."""
    if not ctx.shared:
        return
    leases.lease_require_exclusive(
        workspace=str(ctx.workspace), path=_lease_key(ctx, rel), holder=ctx.holder
    )


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
    rel = args.get("path", ".") or "."
    try:
        fd = _open_dir(ctx, _parts(rel), rel)
    except PathEscape:
        raise
    except ToolFailure:
        raise ToolFailure(f"{rel}: not a folder") from None
    names = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.name == ".git":
                    continue
                if entry.is_symlink():
                    names.append(f"{entry.name}@")
                elif entry.is_dir(follow_symlinks=False):
                    names.append(f"{entry.name}/")
                else:
                    names.append(entry.name)
    finally:
        os.close(fd)
    return "\n".join(sorted(names)) or "(empty)"


def _entries(fd: int) -> list[tuple[str, bool]]:
    """The folder's names, each with whether it is a folder (a link is not one), last name
    first: the walk pops them from the end."""
    with os.scandir(fd) as entries:
        return sorted(((e.name, e.is_dir(follow_symlinks=False)) for e in entries), reverse=True)


def _walk(ctx: ToolContext) -> Generator[tuple[int, str, str], None, None]:
    """Every file of the workspace as (its folder's descriptor, its name, its relative path),
    links included as names (never followed). Each folder is entered by `openat` with
    O_NOFOLLOW from its parent's descriptor, so a folder swapped for a link meanwhile is skipped,
    not followed. The folder's descriptor is valid only until the next item."""
    root = _root_fd(ctx)
    stack: list[tuple[int, str, list[tuple[str, bool]]]] = []
    try:
        stack.append((root, "", _entries(root)))
        while stack:
            fd, prefix, entries = stack[-1]
            if not entries:
                stack.pop()
                os.close(fd)
                continue
            name, is_dir = entries.pop()
            rel = f"{prefix}{name}"
            if not is_dir:
                yield fd, name, rel
                continue
            if name == ".git" or len(stack) > WALK_DEPTH:
                continue
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link or a file since it was listed
            try:
                listed = _entries(inner)
            except OSError:
                os.close(inner)
                continue
            stack.append((inner, f"{rel}/", listed))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _glob(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = args["pattern"]
    if pattern.startswith("/") or ".." in Path(pattern).parts:
        raise ToolFailure(f"{pattern!r}: patterns stay inside the workspace")
    matches = sorted(rel for _, _, rel in _walk(ctx) if fnmatch.fnmatch(rel, pattern))
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
    walk = _walk(ctx)
    # Closed when the search ends early: the walk holds descriptors open.
    with contextlib.closing(walk):
        for dir_fd, name, rel in walk:
            if not fnmatch.fnmatch(rel, only):
                continue
            try:
                text = _read_fd(_open_file(ctx, dir_fd, name, os.O_RDONLY, rel), rel, strict=True)
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


def guard_policy() -> Policy:
    """What holds an agent's command besides the guard: the sandbox, unless it is switched off
    (where it is on but cannot start, no command runs at all)."""
    sandboxed = settings.SANDBOX_MODE != "off"
    return Policy(sandboxed=sandboxed, network=sandboxed and bool(settings.SANDBOX_NETWORK))


def command_check(ctx: ToolContext, command: str) -> None:
    """The guard's verdict, with the traumas of the agent's quantum and the global ones; a
    refused danger is recorded as a trauma of that quantum."""
    verdict = command_judge(
        command, allow=settings.PSYCHONAUTS_COMMAND_ALLOW,
        traumas=traumas_for(quantum_id=ctx.quantum_id), policy=guard_policy(),
    )  # fmt: skip
    if verdict.allowed:
        return
    if verdict.tier == Tier.DANGER:
        worst = max(verdict.parts, key=lambda v: v.tier)
        trauma_record(
            pattern=trauma_pattern(worst.text), reason=f"refused: {worst.reason}",
            source="guard", agent_id=ctx.agent_id, quantum_id=ctx.quantum_id,
        )  # fmt: skip
    raise CommandRefused(verdict.reason)


def _violation(result: SandboxResult) -> str:
    """The limit a command ran into that the runtime measured itself, or "". What the command
    printed says nothing: the agent chose it (a file named `MemoryError` that `ls` lists, a test
    that prints "Read-only file system"). Running out of time is not one either: a slow test
    suite is no incident, and a trauma would refuse it from then on."""
    if result.stopped == "output":
        return "printed more than the output limit"
    if result.stopped == "memory":
        return "went over the memory limit of a command"
    if result.stopped == "worktree":
        return "filled its worktree past the limit"
    return ""


def _shell(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = args["command"]
    command_check(ctx, command)
    timeout = min(args.get("timeout_s", settings.PSYCHONAUTS_SHELL_TIMEOUT_S),
                  settings.PSYCHONAUTS_SHELL_TIMEOUT_S)  # fmt: skip
    result = sandbox_run(
        command,
        workspace=ctx.workspace,
        quantum_id=SHARED_TREE if ctx.shared else ctx.quantum_id,
        timeout_s=timeout,
        env={"ANNIHILATION_AGENT": ctx.agent_id},
        environment=ctx.environment,
    )
    violation = _violation(result) if result.sandboxed else ""
    if violation:
        trauma_record(pattern=trauma_pattern(command), reason=f"sandbox: {violation}",
                      source="sandbox", agent_id=ctx.agent_id,
                      quantum_id=ctx.quantum_id)  # fmt: skip
    if result.stopped == "timeout":
        raise ToolFailure(
            f"timed out after {timeout:.0f}s and was killed\n{truncate(result.output)}"
        )
    if result.stopped == "output":
        raise ToolFailure(
            f"printed more than {settings.SANDBOX_OUTPUT_BYTES // 1024} KiB and was killed\n"
            f"{truncate(result.output)}"
        )
    if result.stopped in ("memory", "worktree"):
        raise ToolFailure(f"stopped: {result.detail}\n{truncate(result.output)}")
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


MAIL_READ_MAX = 50  # messages per read, oldest first

# A recipient's unread messages (mail_unread), marked read by the statement that takes them. The
# rows are locked as they are chosen and rows another reader holds are skipped: two agents reading
# at once (an agent and its role's sibling) never get the same message.
_MAIL_READ = """
UPDATE {table} SET {read_at} = %(now)s
WHERE {id} IN (
    SELECT {id} FROM {table}
    WHERE {recipient} = ANY(%(recipients)s) AND {read_at} IS NULL
    ORDER BY {created_at}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AND {read_at} IS NULL
RETURNING {sender}, {subject}, {body}, {created_at}, {id}
""".format(**sql_names(Mail))


def _mail_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            _MAIL_READ,
            {
                "now": timezone.now(),
                "recipients": [ctx.agent_id, ctx.role],
                "limit": MAIL_READ_MAX,
            },
        )
        unread = sorted(cursor.fetchall(), key=lambda row: (row[3], row[4]))
    if not unread:
        return "(no new mail)"
    return "\n\n".join(f"From {sender}: {subject}\n{body}" for sender, subject, body, *_ in unread)


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
    path = _lease_key(ctx, args["path"])
    mode = args.get("mode", "exclusive")
    leases.lease_acquire(workspace=str(ctx.workspace), path=path, holder=ctx.holder, mode=mode)
    return f"leased {path} ({mode})"


def _lease_release(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _lease_key(ctx, args["path"])
    leases.lease_release(workspace=str(ctx.workspace), path=path, holder=ctx.holder)
    return f"released {path}"


# The verdict tool: its call is the verdict (the runtime reads the last successful one when the
# agent ends, `psychonauts.runtime.verification.verdict_find`); the handler only checks it.
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
    TOOLS.register(replace(_tool, changes_workspace=_tool.name not in _READERS))
