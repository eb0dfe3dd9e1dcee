"""Our tools over MCP for an agent CLI: `ask_tether`, `report_verdict`, `diary`, leases, mail,
`spawn` (`MCP_TOOLS`), served to one CLI agent execution on a unix socket.

- One server per execution, on a socket in a fresh worker-side folder that is bind-mounted into
  that agent's sandbox only: the socket is the agent's identity (nothing inside the sandbox holds
  a token). The CLI starts a stdio MCP server inside the sandbox, `BRIDGE`: a few lines of the
  system's Python that copy its stdin and stdout to and from the socket.
- A call runs the same handler as our loop's tool of that name (`psychonauts.runtime.tools.tool_execute`,
  with the role's allowed tools), in a thread with its own database connection, and is recorded
  as the run's `ToolCall` as our loop records it: the verdict a reviewing role gives is found by
  `verdict_find`, a question's answer lands on its pending call (`tool_call_complete`).
- `ask_tether` keeps our semantics: a question the Tether has not answered yet raises
  `SuspendRun` in its handler; the call stays pending, `suspension` says which it was, and
  `on_suspend` is told so the runner stops the CLI and the run waits holding no worker. The
  answer (or the assumption, at the deadline) completes the call and resumes the run, which
  resumes the CLI's session with it (`psychonauts.executors.claude_code`).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import SocketStream
from anyio.from_thread import BlockingPortal, start_blocking_portal
from anyio.streams.buffered import BufferedByteReceiveStream
from django.db import connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

from core.redaction import redact, redact_data
from psychonauts.errors import SuspendRun, ToolFailure
from psychonauts.executors.permission import PERMISSION_PROMPT, PERMISSION_TOOL
from psychonauts.runtime.checkpoint import tool_call_done, tool_call_open
from psychonauts.runtime.schema import schema_errors
from psychonauts.runtime.tools import TOOLS, ToolContext, ToolResult, tool_execute

logger = logging.getLogger(__name__)

SERVER_NAME = "annihilation"
# Our tools a CLI gets over MCP (its own file and shell tools stand for ours).
MCP_TOOLS = (
    "ask_tether",
    "report_verdict",
    "diary",
    "lease_acquire",
    "lease_release",
    "mail_send",
    "mail_read",
    "spawn",
    "propose_pipeline_change",
)
_LINE_MAX = 4 * 1024 * 1024  # one JSON-RPC message; a longer line ends the connection
# Claude Code passes the model's tool use id in a call's metadata: the recorded call bears it.
_TOOL_USE_META = "claudecode/toolUseId"

# The stdio MCP server the CLI starts inside the sandbox: its stdin to the socket, the socket to
# its stdout. The system's Python, isolated (-I) and without site packages (-S), starts fast.
BRIDGE = """\
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


def mcp_tool_names(allowed: list[str]) -> list[str]:
    """Our tools the role's CLI gets over MCP: those of `MCP_TOOLS` the role allows (all of
    them for a role that lists no tools) and this process has registered."""
    return [n for n in MCP_TOOLS if TOOLS.get(n) and (not allowed or n in allowed)]


@dataclass(frozen=True)
class Suspension:
    """A call whose handler suspended the run (a question to the Tether)."""

    tool_use_id: str
    turn_index: int
    name: str
    input: dict[str, Any]
    reason: str


class McpTools(AbstractContextManager["McpTools"]):
    """The MCP server of one CLI agent execution (see the module's docstring). A context
    manager: the socket exists while it is open."""

    def __init__(
        self,
        ctx: ToolContext,
        *,
        names: list[str],
        allowed: list[str],
        on_suspend: Callable[[Suspension], None],
        permissions: bool = False,
    ) -> None:
        self.ctx = ctx
        self.names = names
        # Offers the permission prompt's tool (Claude Code's `--permission-prompt-tool`).
        self.permissions = permissions
        self.allowed = allowed
        self.on_suspend = on_suspend
        self.suspension: Suspension | None = None
        self.calls = 0
        self._lock = threading.Lock()
        self.folder = Path(tempfile.mkdtemp(prefix="amcp-"))  # short: a socket path < 108 bytes
        self.socket = self.folder / "mcp.sock"
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._served: Future[None] | None = None
        self._server = Server(SERVER_NAME, on_list_tools=self._list, on_call_tool=self._call)

    # the socket ---------------------------------------------------------------------------
    def __enter__(self) -> McpTools:
        self._portal_cm = start_blocking_portal()
        portal = self._portal_cm.__enter__()
        listening: Future[None] = Future()
        self._served = portal.start_task_soon(self._serve, listening)
        listening.result(timeout=30)
        # The sandbox's user (the quantum's uid) connects: the socket is the only thing here.
        self.folder.chmod(0o755)
        self.socket.chmod(0o777)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._served is not None:
            self._served.cancel()
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
        shutil.rmtree(self.folder, ignore_errors=True)

    async def _serve(self, listening: Future[None]) -> None:
        listener = await anyio.create_unix_listener(self.socket)
        listening.set_result(None)
        async with listener:
            await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        reads, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, writes = create_context_streams[SessionMessage](0)
        buffered = BufferedByteReceiveStream(stream)

        async def reader() -> None:
            async with reads:
                while True:
                    try:
                        line = await buffered.receive_until(b"\n", _LINE_MAX)
                    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
                        return
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return
                    if not line.strip():
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except Exception as exc:  # a malformed message is answered, not fatal
                        await reads.send(exc)
                        continue
                    await reads.send(SessionMessage(message))

        async def writer() -> None:
            async with writes:
                async for item in writes:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    try:
                        await stream.send(data.encode() + b"\n")
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return

        async with stream, anyio.create_task_group() as group:
            group.start_soon(reader)
            group.start_soon(writer)
            await self._server.run(
                read_stream, write_stream, self._server.create_initialization_options()
            )
            group.cancel_scope.cancel()

    # the tools ----------------------------------------------------------------------------
    async def _list(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(name=tool.name, description=tool.description, input_schema=tool.schema)
            for name in self.names
            if (tool := TOOLS.get(name)) is not None
        ]
        if self.permissions and (permission := PERMISSION_PROMPT.get(PERMISSION_TOOL)):
            tools.append(
                types.Tool(
                    name=permission.name,
                    description=permission.description,
                    input_schema=permission.schema,
                )
            )
        return types.ListToolsResult(tools=tools)

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta: Any = params.meta or {}
        if not isinstance(meta, dict):
            meta = meta.model_dump(by_alias=True)
        tool_use_id = str(meta.get(_TOOL_USE_META) or "") or f"mcp_{uuid.uuid4().hex[:24]}"
        args = dict(params.arguments or {})
        result = await anyio.to_thread.run_sync(self.call, params.name, args, tool_use_id)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.output)], is_error=result.is_error
        )

    def call(self, name: str, args: dict[str, Any], tool_use_id: str) -> ToolResult:
        """Run one of our tools for the CLI, recorded as the run's tool call."""
        try:
            permission = self.permissions and name == PERMISSION_TOOL
            if name not in self.names and not permission:
                offered = ", ".join(self.names) or "none"
                return ToolResult(f"unknown tool {name!r}; available: {offered}", True)
            with self._lock:
                if self.suspension is not None:
                    return ToolResult("the run is suspended; no more calls are taken", True)
                self.calls += 1
            ctx = replace(self.ctx, tool_use_id=tool_use_id)
            call = tool_call_open(
                agent_run_id=ctx.agent_run_id,
                turn_index=ctx.turn_index,
                tool_use_id=tool_use_id,
                name=name,
                input=redact_data(args),
            )
            try:
                result = (
                    permission_execute(ctx, args)
                    if permission
                    else tool_execute(ctx, name, args, self.allowed)
                )
            except SuspendRun as exc:
                # The call stays pending: its answer completes it and resumes the run.
                suspension = Suspension(
                    tool_use_id, ctx.turn_index, name, redact_data(args), str(exc)
                )
                with self._lock:
                    self.suspension = suspension
                self.on_suspend(suspension)
                return ToolResult(f"{exc}: you will be resumed with the answer", True)
            tool_call_done(
                call_id=call.pk, output=result.output, is_error=result.is_error, duration_ms=0
            )
            return result
        except Exception as exc:
            logger.exception("mcp tool %s failed for agent run %s", name, self.ctx.agent_run_id)
            return ToolResult(f"{name} failed: {type(exc).__name__}: {exc}", True)
        finally:
            connection.close()  # this thread's connection: the CLI may call again in minutes

    # the CLI's configuration --------------------------------------------------------------
    def config(self, socket_inside: Path) -> dict[str, Any]:
        """The `mcpServers` entry a CLI starts our server with, the socket as the sandbox
        sees it."""
        return {
            "type": "stdio",
            "command": "/usr/bin/python3",
            "args": ["-I", "-S", "-c", BRIDGE, str(socket_inside)],
            "env": {},
        }

    def claude_config(self, socket_inside: Path) -> str:
        return json.dumps({"mcpServers": {SERVER_NAME: self.config(socket_inside)}})


def permission_execute(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    permission = PERMISSION_PROMPT.get(PERMISSION_TOOL)
    if permission is None:
        return ToolResult(f"{PERMISSION_TOOL} is not available here", True)
    errors = schema_errors(args, permission.schema)
    if errors:
        return ToolResult(f"invalid arguments for {PERMISSION_TOOL}: " + "; ".join(errors), True)
    try:
        return ToolResult(permission.handler(ctx, args), False)
    except ToolFailure as exc:
        return ToolResult(redact(f"{PERMISSION_TOOL} refused: {exc}"), True)


def claude_tool_name(name: str) -> str:
    """How Claude Code names one of our MCP tools."""
    return f"mcp__{SERVER_NAME}__{name}"


__all__ = [
    "BRIDGE",
    "MCP_TOOLS",
    "PERMISSION_TOOL",
    "SERVER_NAME",
    "McpTools",
    "Suspension",
    "claude_tool_name",
    "mcp_tool_names",
    "permission_execute",
]
