"""The Claude Code executor: one `claude -p` process per agent run, inside the quantum's sandbox.

- The process runs through `psychonauts.containment.sandbox` (the quantum's uid, no network, the worktree
  the only writable path of the repository, our limits on time, CPU, memory, processes, file
  size and output). Its install is bind-mounted read-only; its state folder
  (`CLAUDE_CONFIG_DIR`, where its sessions live) is per agent, outside the worktree, and
  survives the run; the gateway's socket is the only way out (`psychonauts.executors.gateway`).
- The operator's choices win over the repository's: `--setting-sources ""` and
  `--strict-mcp-config` keep a repository's `.claude/settings.json`, hooks and MCP servers out;
  the role's allowed tools become `--allowedTools`; everything else is refused headlessly.
- Its stream-json output becomes the run's events (text, tool calls, tool results), redacted.
- Our tools (`ask_tether`, `report_verdict`, `diary`, leases, mail, `spawn`) are its MCP
  server `annihilation`, reached over a unix socket mounted into the sandbox
  (`psychonauts.executors.mcp`). A question to the Tether stops the CLI and suspends the run
  holding no worker; the answer resumes the CLI's session with it, once.
- Its session id is derived from the agent run and announced before launch: an execution that
  finds the session in the state folder (a killed worker, a redelivery, an answered question)
  continues it with `--resume` instead of starting over.
- At its end, the runtime commits the worktree, verifies and judges exactly as for its own
  agents (`Runner.done`); a failed verification round resumes the session with the feedback.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from bursts.executor import Outcome
from bursts.models import AgentPhase, AgentStatus
from bursts.services.agent_runs import agent_run_beat
from core.redaction import redact, redact_data
from psychonauts.containment.beneath import tree_chown
from psychonauts.containment.sandbox import (
    SandboxUnavailable,
    _environment,
    _kill_group,
    _refusal,
    sandbox_argv,
    sandbox_status,
    sandbox_uid,
    shell_argv,
)
from psychonauts.errors import RateLimitWait, SuspendRun
from psychonauts.executors.base import CLAUDE_CODE, ExecutorError, claude_binary, cli_state_root
from psychonauts.executors.gateway import DUMMY_KEY, Gateway
from psychonauts.executors.mcp import (
    PERMISSION_TOOL,
    McpTools,
    Suspension,
    claude_tool_name,
    mcp_tool_names,
    permission_execute,
)
from psychonauts.models import AgentTurn, ToolCall
from psychonauts.routing import registry
from psychonauts.runtime.checkpoint import turn_answered, turn_open_waiting
from psychonauts.runtime.prompt import agent_prompt
from psychonauts.runtime.runner import Runner
from psychonauts.runtime.runs import run_outcome
from psychonauts.runtime.spawn import agent_spawn
from psychonauts.runtime.tools import ToolContext, tool_execute

# Where the CLI's pieces appear inside the sandbox (its private /tmp holds the mount points).
_INSIDE = Path("/tmp/.cli")
_INSTALL, _STATE, _GATEWAY = _INSIDE / "install", _INSIDE / "state", _INSIDE / "gateway"
_MCP = _INSIDE / "mcp"

# Our tool names and the Claude Code tools that do the same.
_TOOLS = {
    "read_file": ("Read",),
    "list_dir": ("LS", "Glob"),
    "glob": ("Glob",),
    "grep": ("Grep",),
    "write_file": ("Write",),
    "edit_file": ("Edit", "MultiEdit"),
    "shell": ("Bash",),
}
_NAMESPACE = uuid.UUID("9a1c55d2-4f0e-4b8e-9a57-3c1d2b7c1e01")
_STDERR_KEPT = 4000
_SETTLE_S = 5.0  # how long a CLI stopped on a question may take to write its session down
_CONTINUE = (
    "Your previous session was interrupted (the worker running it stopped, or a budget held its "
    "last model call). Check the state of the workspace and continue the task where you left "
    "off."
)
_PERMITTED = (
    "Your session stopped while your use of {tool} waited for the operator's permission; the "
    "answer is:\n\n{output}\n\nIf it was allowed, use the tool again now; otherwise go on "
    "without it."
)
_ANSWERED = (
    "Your session stopped while your {tool} call (id {id}, input {input}) waited; its result "
    "is:\n\n{output}\n\nDo not make that call again: continue your task with its result."
)


def claude_tools(allowed: list[str]) -> list[str]:
    return sorted({t for ours in allowed for t in _TOOLS.get(ours, ())})


@dataclass(frozen=True)
class Seen:
    """Paths as the CLI sees them (inside the sandbox, or the real ones unconfined)."""

    binary: Path
    install: Path
    state: Path
    gateway: Path  # the gateway's socket
    mcp: Path  # our MCP server's socket
    confined: bool = True


@dataclass
class CliEnd:
    """How one CLI process ended."""

    result: str = ""
    is_error: bool = False
    subtype: str = ""
    returncode: int | None = None
    stderr: str = ""
    stopped: str = ""  # timeout | output | malformed | cancelled | suspended
    detail: str = ""
    usage: dict[str, Any] = field(default_factory=dict)


class ClaudeCodeRunner(Runner):
    """An agent run whose loop is Claude Code's (the commit, verification, verdict and end are
    `Runner`'s)."""

    # A pipe our MCP server's thread writes to when a call suspended the run.
    _wake_r: int = -1
    _wake_w: int = -1
    # The results of the calls the run waited on, for the resumed session.
    answered: str = ""
    # The state folder and session id of the CLI running now, and its MCP server.
    _session: tuple[Path, str] | None = None
    _mcp: McpTools | None = None

    # What differs between the CLIs (`psychonauts.executors.codex` overrides these).
    executor = CLAUDE_CODE
    state_name = "claude"
    api = "anthropic"
    # Its permission prompts go to the Tether through our MCP server.
    permission_prompts = True

    def cli_binary(self) -> Path:
        return claude_binary()

    def cli_install(self, binary: Path) -> Path:
        """The folder mounted read-only as the CLI's install."""
        return binary.parents[4] if binary.name == "claude.exe" else binary.parent

    def cli_session(self, state: Path) -> str:
        """The CLI session this run continues, or starts ("" when the CLI names it itself)."""
        return self.session_uuid()

    def session_uuid(self) -> str:
        run = self.run
        return str(uuid.uuid5(_NAMESPACE, f"{run.agent_id}:{run.attempt}:{run.pk}"))

    def state_dir(self) -> Path:
        """The agent's CLI state (sessions), kept across executions of the run."""
        return cli_state_root() / self.run.agent_id / self.state_name

    def session_known(self, state: Path, session: str) -> bool:
        return bool(self.session_files(state, session))

    def loop(self) -> Outcome:
        binary = self.cli_binary()
        if not binary.is_file():
            raise ExecutorError(
                f"the {self.executor} executor is not installed on this worker ({binary} missing); "
                "`manage.py psychonaut executors` says how to install it"
            )
        status = sandbox_status()
        if status.state == "unavailable":
            raise SandboxUnavailable(_refusal(status))
        workspace = self.workspace
        state = self.state_dir()
        state.mkdir(parents=True, exist_ok=True)
        uid = sandbox_uid(self.run.quantum_id)
        if uid is not None and status.state == "on":
            os.chown(state.parent, uid, uid)
            tree_chown(state, uid)
        self.refuse_role()
        # A question the run waited on: its answer is the resumed session's first message (or
        # the run waits again, its question still open).
        answered = self.answers()
        prompt = answered or agent_prompt(self.run)
        # The model the run was routed to is the only one its CLI may call (its side requests,
        # titles and summaries, are pointed at the same model).
        allowed = {self.model}
        gateway = Gateway(
            self.run, provider=self.executor, allowed_models=frozenset(allowed), wave=self.wave,
            api=self.api,
        )  # fmt: skip
        self._wake_r, self._wake_w = os.pipe()
        gateway.on_hold = self.wake
        mcp = McpTools(
            self.tool_context(AgentTurn.objects.filter(agent_run=self.run).count()),
            names=mcp_tool_names(list(self.role.allowed_tools)),
            allowed=list(self.role.allowed_tools),
            on_suspend=self.suspended,
            permissions=self.permission_prompts,
        )
        try:
            with gateway, mcp:
                return self.rounds(binary, workspace, state, gateway, mcp, prompt)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def rounds(
        self, binary: Path, workspace: Path, state: Path, gateway: Gateway, mcp: McpTools,
        prompt: str,
    ) -> Outcome:  # fmt: skip
        for round in range(1, 100):
            session = self.cli_session(state)
            resume = bool(session) and self.session_known(state, session)
            if round == 1 and self.answered and not resume:
                # Its session is not on this host (resumed on another one): it starts over,
                # with the answers it waited for.
                prompt = agent_prompt(self.run) + "\n\n" + self.answered
            elif resume and round == 1 and not self.answered:
                # An earlier execution was cut off (a killed worker): its session goes on.
                prompt = _CONTINUE
            self.phase(AgentPhase.THINKING)
            self.emit(
                "cli_session_started",
                executor=self.executor,
                session_id=session,
                resume=resume,
                round=round,
            )
            self.flush_events()  # the session id is durable before the CLI starts
            self._session, self._mcp = (state, session), mcp
            end = self.launch(
                binary, workspace, state, gateway, mcp, session=session, resume=resume,
                prompt=prompt,
            )  # fmt: skip
            self.changed = True  # the CLI may have changed anything in the worktree
            if mcp.suspension is not None:
                self.suspend(mcp.suspension)
            if end.stopped == "cancelled":
                self.run.refresh_from_db(fields=["status", "result", "error"])
                registry.registry_remove(self.run.pk)
                if self.run.status == AgentStatus.CANCELLED:
                    self.emit("cancelled", reason="cancelled by the burst manager")
                self.flush_events()
                return run_outcome(self.run)
            if gateway.hold:
                # Held by a spend gate before a call, or by an upstream's long rate limit: the
                # run waits holding no worker, and its release (or the wait's end) resumes the
                # CLI's session (the held call is made then).
                self.flush_events()
                if gateway.hold_wait_s:
                    raise RateLimitWait(gateway.hold, wait_s=gateway.hold_wait_s)
                raise SuspendRun(gateway.hold)
            if gateway.refusal:
                raise ExecutorError(f"{self.executor} stopped: {gateway.refusal}")
            if end.stopped:
                raise ExecutorError(
                    f"{self.executor} stopped by the sandbox's limits: {end.detail}"
                )
            if end.is_error or end.returncode not in (0, None) or not end.subtype:
                raise ExecutorError(_failure(self.executor, end))
            self.emit(
                "cli_result",
                subtype=end.subtype,
                tokens_in=gateway.metered.tokens_in,
                tokens_out=gateway.metered.tokens_out,
                cost_usd=str(gateway.metered.cost_usd),
                calls=gateway.metered.calls,
            )
            turn = AgentTurn(
                agent_run=self.run,
                index=round - 1,
                assistant=[{"type": "text", "text": redact(end.result)}],
            )
            outcome = self.done(turn)
            if outcome is not None:
                return outcome
            # A failed verification round: the session goes on with the feedback.
            prompt = "".join(str(b.get("text", "")) for b in turn.tool_results)
        raise ExecutorError(f"{self.executor}: too many verification rounds")

    # our tools -----------------------------------------------------------------------------
    def tool_context(self, turn_index: int) -> ToolContext:
        """Our tools' context for the CLI's calls of this execution."""
        return ToolContext(
            agent_run_id=self.run.pk,
            agent_id=self.run.agent_id,
            attempt=self.run.attempt,
            quantum_id=self.run.quantum_id,
            role=self.run.role,
            depth=self.run.depth,
            workspace=self.workspace,
            shared=settings.PSYCHONAUTS_WORKSPACE_MODE == "shared",
            turn_index=turn_index,
            spawn=lambda specs: agent_spawn(
                parent=self.run, turn_index=turn_index, specs=specs, execute=self.execute
            ),
        )

    def suspended(self, suspension: Suspension) -> None:
        """Called from the MCP server's thread: wake the stream's loop, which stops the CLI."""
        self.wake()

    def wake(self) -> None:
        """The run must wait (a question, a hold): the stream's loop stops the CLI."""
        os.write(self._wake_w, b"s")

    def settle(self) -> None:
        """Before the CLI is stopped on a question: wait (a few seconds at most) until its
        session file holds the call, so the resumed session knows it asked and is answered
        rather than asking again."""
        suspension = self._mcp.suspension if self._mcp is not None else None
        session = self._session
        if suspension is None or session is None:
            return
        state, name = session
        deadline = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline:
            for path in self.session_files(state, name):
                with contextlib.suppress(OSError):
                    if self.settled(path.read_text(errors="replace"), suspension):
                        return
            time.sleep(0.02)

    def session_files(self, state: Path, session: str) -> list[Path]:
        """The files the CLI keeps the session in."""
        return list(state.glob(f"projects/*/{session}.jsonl"))

    def settled(self, text: str, suspension: Suspension) -> bool:
        """Whether a session file's text holds the call that suspended the run."""
        return suspension.tool_use_id in text

    def suspend(self, suspension: Suspension) -> None:
        """The CLI stopped on a question: the call is kept as an open turn (what wakes and
        resumes a waiting agent looks for one), and the run waits holding no worker."""
        turn_open_waiting(
            agent_run_id=self.run.pk,
            tool_use={
                "type": "tool_use",
                "id": suspension.tool_use_id,
                "name": suspension.name,
                "input": suspension.input,
            },
        )
        self.flush_events()
        raise SuspendRun(suspension.reason)

    def answers(self) -> str:
        """The results of the calls the run waited on, as the resumed session's first message
        ("" when it waited on none). A call still open is asked again: answered meanwhile, its
        result is read; still pending, the run waits again (SuspendRun)."""
        texts: list[str] = []
        for turn in AgentTurn.objects.filter(agent_run=self.run, complete=False).order_by("index"):
            results = []
            for use in turn.assistant:
                if use.get("type") != "tool_use":
                    continue
                call = ToolCall.objects.filter(agent_run=self.run, tool_use_id=use["id"]).first()
                if call is None or not call.completed:
                    ctx = self.tool_context(turn.index)
                    ctx.tool_use_id = use["id"]
                    result = (
                        permission_execute(ctx, use["input"])
                        if use["name"] == PERMISSION_TOOL
                        else tool_execute(
                            ctx, use["name"], use["input"], list(self.role.allowed_tools)
                        )
                    )
                    output, is_error = result.output, result.is_error
                else:
                    output, is_error = call.output, call.is_error
                results.append(
                    {"type": "tool_result", "tool_use_id": use["id"], "content": output,
                     "is_error": is_error}
                )  # fmt: skip
                texts.append(
                    _PERMITTED.format(tool=use["input"].get("tool_name", "?"), output=output)
                    if use["name"] == PERMISSION_TOOL
                    else _ANSWERED.format(
                        tool=use["name"], id=use["id"], input=json.dumps(use["input"]),
                        output=output,
                    )
                )  # fmt: skip
                self.emit("tool_result", id=use["id"], name=use["name"], output=output[:2000],
                          is_error=is_error)  # fmt: skip
            turn_answered(turn_id=turn.pk, tool_results=results)
        self.answered = "\n\n".join(texts)
        return self.answered

    def refuse_role(self) -> None:
        """A role this CLI cannot run within what the operator allowed: ExecutorError."""

    def invocation(
        self, seen: Seen, mcp: McpTools, *, session: str, resume: bool, prompt: str,
        timeout: float,
    ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """The CLI's command line and environment, with the paths it sees."""
        argv = [
            str(seen.binary),
            "-p", prompt,
            "--output-format", "stream-json", "--verbose",
            "--model", self.model,
            "--setting-sources", "", "--strict-mcp-config",
            "--permission-mode", "acceptEdits",
            "--append-system-prompt", self.role.system_prompt,
            "--max-turns", str(self.role.max_turns),
        ]  # fmt: skip
        # Only the role's tools exist for the CLI (`--tools`), and they need no prompt
        # (`--allowedTools`): acceptEdits alone would also let file commands (touch, mkdir ...)
        # through Bash for a role without a shell.
        tools = ",".join(claude_tools(list(self.role.allowed_tools)))
        argv += ["--tools", tools]
        # Our tools over MCP need no prompt either.
        ours = [claude_tool_name(n) for n in mcp.names]
        allowed = ",".join([*filter(None, tools.split(",")), *ours])
        if allowed:
            argv += ["--allowedTools", allowed]
        argv += ["--mcp-config", mcp.claude_config(seen.mcp)]
        # What it would ask a user goes to the Tether as a question (never an automatic yes).
        argv += ["--permission-prompt-tool", claude_tool_name(PERMISSION_TOOL)]
        argv += ["--resume", session] if resume else ["--session-id", session]
        env = {
            "CLAUDE_CONFIG_DIR": str(seen.state),
            "ANTHROPIC_BASE_URL": "http://localhost",
            "ANTHROPIC_UNIX_SOCKET": str(seen.gateway),
            "ANTHROPIC_API_KEY": DUMMY_KEY,
            "ANTHROPIC_SMALL_FAST_MODEL": self.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "ENABLE_TOOL_SEARCH": "false",
            # An MCP call may wait minutes (a spawned sub-agent): the role's time bounds it.
            "MCP_TOOL_TIMEOUT": str(int(timeout * 1000)),
        }
        return argv, env

    def launch(
        self, binary: Path, workspace: Path, state: Path, gateway: Gateway, mcp: McpTools, *,
        session: str, resume: bool, prompt: str,
    ) -> CliEnd:  # fmt: skip
        install = self.cli_install(binary)
        confined = sandbox_status().state == "on"
        if confined:
            seen = Seen(
                binary=_INSTALL / binary.relative_to(install), install=_INSTALL, state=_STATE,
                gateway=_GATEWAY / gateway.socket.name, mcp=_MCP / mcp.socket.name,
            )  # fmt: skip
        else:  # unconfined by setting: the same process, the real paths
            seen = Seen(binary, install, state, gateway.socket, mcp.socket, confined=False)
        timeout = float(self.role.timeout_s)
        argv, env = self.invocation(
            seen, mcp, session=session, resume=resume, prompt=prompt, timeout=timeout
        )
        command = shell_argv("exec " + shlex.join(argv), timeout)
        if confined:
            full = sandbox_argv(command, workspace=workspace, quantum_id=self.run.quantum_id)
            # The CLI's own mounts go after the sandbox's (inside its private /tmp).
            at = full.index("--unshare-ipc")
            extra = [
                "--perms", "0755", "--dir", str(_INSIDE),
                "--ro-bind", str(install), str(_INSTALL),
                "--bind", str(state), str(_STATE),
                "--ro-bind", str(gateway.folder), str(_GATEWAY),
                "--ro-bind", str(mcp.folder), str(_MCP),
            ]  # fmt: skip
            full[at:at] = extra
            environment = _environment(Path("/tmp"), env)
        else:
            full = list(command)
            environment = _environment(workspace, env)
        return self.stream(full, workspace, environment, timeout)

    def stream(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> CliEnd:
        """Run the CLI, turning each line of its stream into events as it comes."""
        end = CliEnd()
        limit = int(settings.SANDBOX_OUTPUT_BYTES) * 20  # a whole session's stream, not a command's
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        pending, err, total = b"", b"", 0
        # The run's heartbeat while the CLI works (one statement, not per line): a run whose
        # heartbeat ages past its TTL is presumed dead and taken over.
        beat_every = max(0.1, float(settings.BURSTS_HEARTBEAT_TTL_S) / 3)
        beat_at = started + beat_every
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                sel.register(proc.stderr, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while len(sel.get_map()) > 1 and not end.stopped:
                    left = started + timeout - time.monotonic()
                    if left <= 0:
                        end.stopped, end.detail = "timeout", f"no end after {timeout:.0f}s"
                        break
                    for key, _ in sel.select(timeout=min(left, 1.0)):
                        if key.fileobj == self._wake_r:  # a question or a hold: the run waits
                            os.read(self._wake_r, 64)
                            end.stopped, end.detail = "suspended", "the run waits"
                            self.settle()
                            break
                        data = os.read(key.fd, 65536)
                        if not data:
                            sel.unregister(key.fileobj)
                            continue
                        total += len(data)
                        if total > limit:
                            end.stopped, end.detail = "output", f"more than {limit} bytes of output"
                            break
                        if key.fileobj is proc.stderr:
                            err = (err + data)[-_STDERR_KEPT:]
                            continue
                        pending += data
                        *lines, pending = pending.split(b"\n")
                        for line in lines:
                            if line.strip() and not self.on_line(line, end):
                                break
                        if end.stopped:
                            break
                    if not end.stopped:
                        self.flush_text()
                        self.flush_events()
                    if not end.stopped and time.monotonic() >= beat_at:
                        beat_at = time.monotonic() + beat_every
                        if not self.beat():
                            end.stopped, end.detail = "cancelled", "the run was ended meanwhile"
            if pending.strip() and not end.stopped:
                self.on_line(pending, end)
        finally:
            if end.stopped or (proc.poll() is None and end.stopped):
                _kill_group(proc)
            try:
                end.returncode = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                end.returncode = proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        end.stderr = redact(err.decode("utf-8", errors="replace"))
        if end.returncode is not None and end.returncode < 0:
            end.detail = end.detail or f"killed by signal {signal.Signals(-end.returncode).name}"
        self.flush_text()
        self.flush_events()
        return end

    def beat(self) -> bool:
        """Stamp the run's heartbeat and phase; False when it is no longer running (the burst
        manager cancelled it, or another execution ended it)."""
        now = timezone.now()
        self.run.heartbeat_at = now
        running = agent_run_beat(agent_run_id=self.run.pk, phase=self.run.phase, now=now)
        if not connection.in_atomic_block:
            connection.close()  # not held while the CLI works for minutes
        return running

    def on_line(self, line: bytes, end: CliEnd) -> bool:
        """One stream-json line into events; False (and the run stopped) when it is not JSON."""
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not an object")
        except ValueError:
            shown = redact(line[:200].decode("utf-8", errors="replace"))
            end.stopped, end.detail = (
                "malformed",
                f"{self.executor} printed malformed JSON: {shown!r}",
            )
            return False
        kind = item.get("type")
        message: dict[str, Any] = item["message"] if isinstance(item.get("message"), dict) else {}
        content: list[Any] = message["content"] if isinstance(message.get("content"), list) else []
        if kind == "system" and item.get("subtype") == "init":
            self.emit("cli_started", model=item.get("model", ""), tools=item.get("tools", []))
        elif kind == "assistant":
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and block.get("text"):
                    self.on_text(str(block["text"]) + "\n")
                elif block.get("type") == "tool_use":
                    self.end_text()
                    self.phase(AgentPhase.TOOL_USE)
                    self.emit(
                        "tool_call",
                        id=block.get("id", ""),
                        name=block.get("name", ""),
                        input=redact_data(block.get("input", {})),
                    )
        elif kind == "user":
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    output = block.get("content", "")
                    if isinstance(output, list):
                        output = "".join(
                            str(b.get("text", "")) for b in output if isinstance(b, dict)
                        )
                    self.emit(
                        "tool_result",
                        id=block.get("tool_use_id", ""),
                        output=redact(str(output))[:2000],
                        is_error=bool(block.get("is_error")),
                    )
        elif kind == "result":
            self.end_text()
            end.result = str(item.get("result", "") or "")
            end.is_error = bool(item.get("is_error"))
            end.subtype = str(item.get("subtype", "")) or "unknown"
            end.usage = item.get("usage") or {}
        return True


def _failure(executor: str, end: CliEnd) -> str:
    if end.subtype and end.is_error:
        return f"{executor} ended in error ({end.subtype}): {redact(end.result)[:500]}"
    if end.returncode not in (0, None):
        tail = end.stderr.strip().splitlines()[-5:]
        why = " | ".join(tail) if tail else (end.detail or "no output on stderr")
        return f"{executor} exited with status {end.returncode}: {why}"
    return f"{executor} ended without a result event (its stream stopped early)"


def claude_code_runner_class() -> type[Runner]:
    return ClaudeCodeRunner


__all__ = ["AgentStatus", "ClaudeCodeRunner", "claude_code_runner_class", "claude_tools"]
