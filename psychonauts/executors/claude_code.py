"""The Claude Code executor: one `claude -p` process per agent run, inside the quantum's sandbox.

- The process runs through `psychonauts.sandbox` (the quantum's uid, no network, the worktree
  the only writable path of the repository, our limits on time, CPU, memory, processes, file
  size and output). Its install is bind-mounted read-only; its state folder
  (`CLAUDE_CONFIG_DIR`, where its sessions live) is per agent, outside the worktree, and
  survives the run; the gateway's socket is the only way out (`psychonauts.executors.gateway`).
- The operator's choices win over the repository's: `--setting-sources ""` and
  `--strict-mcp-config` keep a repository's `.claude/settings.json`, hooks and MCP servers out;
  the role's allowed tools become `--allowedTools`; everything else is refused headlessly.
- Its stream-json output becomes the run's events (text, tool calls, tool results), redacted.
- Its session id is derived from the agent run and announced before launch: an execution that
  finds the session in the state folder (a killed worker, a redelivery) continues it with
  `--resume` instead of starting over.
- At its end, the runtime commits the worktree, verifies and judges exactly as for its own
  agents (`Runner.done`); a failed verification round resumes the session with the feedback.
"""

from __future__ import annotations

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
from psychonauts import registry
from psychonauts.beneath import tree_chown
from psychonauts.executors.base import ExecutorError, claude_binary
from psychonauts.executors.gateway import DUMMY_KEY, Gateway
from psychonauts.models import AgentTurn
from psychonauts.sandbox import (
    SandboxUnavailable,
    _environment,
    _kill_group,
    _refusal,
    sandbox_argv,
    sandbox_status,
    sandbox_uid,
    shell_argv,
)
from psychonauts.services.prompt import agent_prompt
from psychonauts.services.runner import Runner
from psychonauts.services.runs import run_outcome

# Where the CLI's pieces appear inside the sandbox (its private /tmp holds the mount points).
_INSIDE = Path("/tmp/.cli")
_INSTALL, _STATE, _GATEWAY = _INSIDE / "install", _INSIDE / "state", _INSIDE / "gateway"

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
_CONTINUE = (
    "Your previous session was interrupted (the worker running it stopped). Check the state of "
    "the workspace and continue the task where you left off."
)


def claude_tools(allowed: list[str]) -> list[str]:
    return sorted({t for ours in allowed for t in _TOOLS.get(ours, ())})


@dataclass
class CliEnd:
    """How one CLI process ended."""

    result: str = ""
    is_error: bool = False
    subtype: str = ""
    returncode: int | None = None
    stderr: str = ""
    stopped: str = ""  # timeout | output | malformed
    detail: str = ""
    usage: dict[str, Any] = field(default_factory=dict)


class ClaudeCodeRunner(Runner):
    """An agent run whose loop is Claude Code's (the commit, verification, verdict and end are
    `Runner`'s)."""

    def session_uuid(self) -> str:
        run = self.run
        return str(uuid.uuid5(_NAMESPACE, f"{run.agent_id}:{run.attempt}:{run.pk}"))

    def state_dir(self) -> Path:
        """The agent's CLI state (sessions), kept across executions of the run."""
        return Path(settings.ANNIHILATION_HOME) / "cli-state" / self.run.agent_id / "claude"

    def session_known(self, state: Path, session: str) -> bool:
        return any(state.glob(f"projects/*/{session}.jsonl"))

    def loop(self) -> Outcome:
        binary = claude_binary()
        if not binary.is_file():
            raise ExecutorError(
                f"the claude-code executor is not installed on this worker ({binary} missing); "
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
        session = self.session_uuid()
        prompt = agent_prompt(self.run)
        # The model the run was routed to is the only one its CLI may call (its side requests,
        # titles and summaries, are pointed at the same model).
        allowed = {self.model}
        gateway = Gateway(
            self.run, provider="claude-code", allowed_models=frozenset(allowed), wave=self.wave
        )
        with gateway:
            for round in range(1, 100):
                resume = self.session_known(state, session)
                if resume and round == 1:
                    # An earlier execution was cut off (a killed worker): its session goes on.
                    prompt = _CONTINUE
                self.phase(AgentPhase.THINKING)
                self.emit(
                    "cli_session_started",
                    executor="claude-code",
                    session_id=session,
                    resume=resume,
                    round=round,
                )
                self.flush_events()  # the session id is durable before the CLI starts
                end = self.launch(
                    binary, workspace, state, gateway, session=session, resume=resume,
                    prompt=prompt,
                )  # fmt: skip
                self.changed = True  # the CLI may have changed anything in the worktree
                if end.stopped == "cancelled":
                    self.run.refresh_from_db(fields=["status", "result", "error"])
                    registry.registry_remove(self.run.pk)
                    if self.run.status == AgentStatus.CANCELLED:
                        self.emit("cancelled", reason="cancelled by the burst manager")
                    self.flush_events()
                    return run_outcome(self.run)
                if gateway.refusal:
                    raise ExecutorError(f"claude-code stopped: {gateway.refusal}")
                if end.stopped:
                    raise ExecutorError(
                        f"claude-code stopped by the sandbox's limits: {end.detail}"
                    )
                if end.is_error or end.returncode not in (0, None) or not end.subtype:
                    raise ExecutorError(_failure(end))
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
        raise ExecutorError("claude-code: too many verification rounds")

    def argv(self, *, session: str, resume: bool, prompt: str) -> list[str]:
        argv = [
            str(_INSTALL / "node_modules/@anthropic-ai/claude-code/bin/claude.exe"),
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
        if tools:
            argv += ["--allowedTools", tools]
        argv += ["--resume", session] if resume else ["--session-id", session]
        return argv

    def launch(
        self, binary: Path, workspace: Path, state: Path, gateway: Gateway, *, session: str,
        resume: bool, prompt: str,
    ) -> CliEnd:  # fmt: skip
        install = binary.parents[4] if binary.name == "claude.exe" else binary.parent
        argv = self.argv(session=session, resume=resume, prompt=prompt)
        if Path(argv[0]) != _INSTALL / binary.relative_to(install):
            argv[0] = str(_INSTALL / binary.relative_to(install))
        timeout = float(self.role.timeout_s)
        command = shell_argv("exec " + shlex.join(argv), timeout)
        env = {
            "CLAUDE_CONFIG_DIR": str(_STATE),
            "ANTHROPIC_BASE_URL": "http://localhost",
            "ANTHROPIC_UNIX_SOCKET": str(_GATEWAY / gateway.socket.name),
            "ANTHROPIC_API_KEY": DUMMY_KEY,
            "ANTHROPIC_SMALL_FAST_MODEL": self.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "ENABLE_TOOL_SEARCH": "false",
        }
        status = sandbox_status()
        if status.state == "on":
            full = sandbox_argv(command, workspace=workspace, quantum_id=self.run.quantum_id)
            # The CLI's own mounts go after the sandbox's (inside its private /tmp).
            at = full.index("--unshare-ipc")
            extra = [
                "--perms", "0755", "--dir", str(_INSIDE),
                "--ro-bind", str(install), str(_INSTALL),
                "--bind", str(state), str(_STATE),
                "--ro-bind", str(gateway.folder), str(_GATEWAY),
            ]  # fmt: skip
            full[at:at] = extra
            environment = _environment(Path("/tmp"), env)
        else:  # unconfined by setting: the same process, the real paths
            full = list(command)
            full[-1] = full[-1].replace(shlex.quote(argv[0]), shlex.quote(str(binary)))
            env["CLAUDE_CONFIG_DIR"] = str(state)
            env["ANTHROPIC_UNIX_SOCKET"] = str(gateway.socket)
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
                while sel.get_map() and not end.stopped:
                    left = started + timeout - time.monotonic()
                    if left <= 0:
                        end.stopped, end.detail = "timeout", f"no end after {timeout:.0f}s"
                        break
                    for key, _ in sel.select(timeout=min(left, 1.0)):
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
            end.stopped, end.detail = "malformed", f"claude-code printed malformed JSON: {shown!r}"
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


def _failure(end: CliEnd) -> str:
    if end.subtype and end.is_error:
        return f"claude-code ended in error ({end.subtype}): {redact(end.result)[:500]}"
    if end.returncode not in (0, None):
        tail = end.stderr.strip().splitlines()[-5:]
        why = " | ".join(tail) if tail else (end.detail or "no output on stderr")
        return f"claude-code exited with status {end.returncode}: {why}"
    return "claude-code ended without a result event (its stream stopped early)"


def claude_code_runner_class() -> type[Runner]:
    return ClaudeCodeRunner


__all__ = ["AgentStatus", "ClaudeCodeRunner", "claude_code_runner_class", "claude_tools"]
