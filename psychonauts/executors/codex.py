"""The Codex executor: one `codex exec --json` process per agent run, inside the quantum's sandbox.

Everything around the CLI is the Claude Code executor's (`ClaudeCodeRunner`: the sandbox and its
mounts, the per-agent state folder, the gateway, our tools over MCP, the heartbeat, the commit,
verification and verdict, the faults); what differs:

- Codex speaks only OpenAI's Responses API, and only over TCP: a custom provider
  (`-c model_providers.annihilation={..., wire_api="responses"}`) points it at
  `http://127.0.0.1:<port>/v1` inside the sandbox's own network namespace, where `FORWARDER`
  (the system's Python, started before Codex) copies each connection to the gateway's unix
  socket. The gateway (`api="openai"`) meters `POST /v1/responses`.
- Codex's own sandbox cannot run inside bubblewrap and ours contains it:
  `--dangerously-bypass-approvals-and-sandbox`. Its analytics, update checks and web search are
  off. Its tools are its own (a shell, `apply_patch`) and cannot be narrowed, so a role runs under
  codex only when it allows `shell`, `write_file` and `edit_file` (else the run is refused).
- Its state (`CODEX_HOME`, where its threads live) is `cli-state/<agent>/codex`. Codex names its
  thread itself: the id from its first event (`thread.started`) is written as a `cli_session_started`
  event at once, and a later execution of the run continues it with
  `codex exec resume <thread_id>`.
- Its `--json` stream becomes the run's events: `agent_message` as text, `command_execution`,
  `file_change` and `mcp_tool_call` items as tool calls and results, `turn.completed` as the
  end; `turn.failed` and `error` events are the run's error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bursts.models import AgentPhase
from core.models import Event
from core.redaction import redact, redact_data
from psychonauts.executors.base import CODEX, ExecutorError, codex_binary
from psychonauts.executors.claude_code import ClaudeCodeRunner, CliEnd, Seen
from psychonauts.executors.gateway import DUMMY_KEY
from psychonauts.executors.mcp import SERVER_NAME, McpTools, Suspension

PROVIDER = "annihilation"
_PORT = 47617  # inside the sandbox's own network namespace: nothing else listens there
_NEEDS = ("shell", "write_file", "edit_file")
_DISABLED = ("multi_agent", "goals", "hooks", "plugins", "apps", "image_generation")

# Started inside the sandbox in Codex's place: listens on 127.0.0.1 (the sandbox's own loopback),
# then starts Codex (its argv after the socket and port) and copies each connection to the
# gateway's socket until Codex exits, with Codex's status. Port 0 (unconfined) takes a free one,
# written into Codex's arguments where `{port}` stands.
FORWARDER = """\
import os, socket, sys, threading
path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(64)
port = server.getsockname()[1]
argv = [a.replace("{port}", str(port)) for a in argv]
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve():
    while True:
        client, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
pid = os.fork()
if pid == 0:
    server.close()
    os.execv(argv[0], argv)
_, status = os.waitpid(pid, 0)
os._exit(os.waitstatus_to_exitcode(status) % 256)
"""


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


class CodexRunner(ClaudeCodeRunner):
    """An agent run whose loop is Codex's."""

    executor = CODEX
    state_name = "codex"
    api = "openai"
    permission_prompts = False  # it runs with approvals off: ours is the only sandbox
    _thread = ""  # the thread Codex announced in this execution

    def cli_binary(self) -> Path:
        return codex_binary()

    def cli_install(self, binary: Path) -> Path:
        # node_modules/@openai/codex-linux-x64/vendor/<target>/bin/codex: the install's root.
        for parent in binary.parents:
            if parent.name == "node_modules":
                return parent.parent
        return binary.parent

    def refuse_role(self) -> None:
        allowed = list(self.role.allowed_tools)
        missing = [t for t in _NEEDS if allowed and t not in allowed]
        if missing:
            raise ExecutorError(
                f"role {self.role.name!r} cannot run under codex: Codex's own shell and patch "
                f"tools cannot be narrowed, and the role does not allow {', '.join(missing)}"
            )

    def cli_session(self, state: Path) -> str:
        """The thread Codex named in an earlier execution of this run ("" before its first)."""
        found = (
            Event.objects.filter(
                topic=self.topic, type="cli_session_started", payload__agent_run_id=self.run.pk
            )
            .exclude(payload__thread_id=None)
            .order_by("-id")
            .values_list("payload__thread_id", flat=True)
            .first()
        )
        return str(found or "")

    def session_known(self, state: Path, session: str) -> bool:
        return bool(self.session_files(state, session))

    def session_files(self, state: Path, session: str) -> list[Path]:
        thread = session or self._thread
        return list(state.glob(f"sessions/**/*{thread}*.jsonl")) if thread else []

    def invocation(
        self, seen: Seen, mcp: McpTools, *, session: str, resume: bool, prompt: str,
        timeout: float,
    ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        port = _PORT if seen.confined else 0
        provider = (
            f'{{name="{PROVIDER}", base_url="http://127.0.0.1:{{port}}/v1", env_key='
            f'"CODEX_GATEWAY_KEY", wire_api="responses"}}'
        )
        config = [
            f"model_provider={PROVIDER}",
            f"model_providers.{PROVIDER}={provider}",
            "analytics.enabled=false",
            "check_for_update_on_startup=false",
            'web_search="disabled"',
            f"developer_instructions={_toml(self.role.system_prompt)}",
        ]
        if mcp.names:
            server = mcp.config(seen.mcp)
            args = ", ".join(_toml(a) for a in server["args"])
            config.append(
                f"mcp_servers.{SERVER_NAME}={{command={_toml(server['command'])}, "
                f"args=[{args}], tool_timeout_sec={int(timeout)}, startup_timeout_sec=30}}"
            )
        codex = [str(seen.binary), "exec"]
        if resume:
            codex.append("resume")
        codex += ["--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        codex += ["-m", self.model]
        # Its own sub-agents, goals and hooks (a repository's too) are not the operator's: our
        # spawn is the way to sub-agents.
        for feature in _DISABLED:
            codex += ["--disable", feature]
        for item in config:
            codex += ["-c", item]
        codex += [session, prompt] if resume else [prompt]
        argv = ["/usr/bin/python3", "-I", "-S", "-c", FORWARDER, str(seen.gateway), str(port)]
        rg = seen.binary.parent.parent / "codex-path"  # its bundled ripgrep
        env = {
            "CODEX_HOME": str(seen.state),
            "CODEX_GATEWAY_KEY": DUMMY_KEY,
            "PATH": f"{rg}:/usr/local/bin:/usr/bin:/bin",
        }
        return argv + codex, env

    def settled(self, text: str, suspension: Suspension) -> bool:
        # Codex's thread records a call by its own id: the tool's name stands for it.
        return suspension.tool_use_id in text or suspension.name in text

    def on_line(self, line: bytes, end: CliEnd) -> bool:
        """One `--json` line into events; False (and the run stopped) when it is not JSON."""
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not an object")
        except ValueError:
            shown = redact(line[:200].decode("utf-8", errors="replace"))
            end.stopped, end.detail = "malformed", f"codex printed malformed JSON: {shown!r}"
            return False
        kind = item.get("type")
        if kind == "thread.started":
            thread = self._thread = str(item.get("thread_id", ""))
            # Durable at once: a worker killed from here on resumes this thread.
            self.emit("cli_session_started", executor=CODEX, thread_id=thread, started=True)
            self.flush_events()
        elif kind == "turn.started":
            self.phase(AgentPhase.THINKING)
        elif kind in ("item.started", "item.completed"):
            body = item.get("item")
            if isinstance(body, dict):
                self.on_item(body, done=kind == "item.completed", end=end)
        elif kind == "turn.completed":
            self.end_text()
            end.subtype, end.is_error = "success", False
            end.usage = item.get("usage") or {}
        elif kind == "turn.failed":
            self.end_text()
            error = item.get("error") if isinstance(item.get("error"), dict) else {}
            end.subtype, end.is_error = "turn_failed", True
            end.result = str((error or {}).get("message", "") or "the turn failed")
        elif kind == "error":
            self.emit("cli_error", message=redact(str(item.get("message", ""))))
        return True

    def on_item(self, item: dict[str, Any], *, done: bool, end: CliEnd) -> None:
        kind, ident = item.get("type"), str(item.get("id", ""))
        if kind == "agent_message" and done:
            text = str(item.get("text", ""))
            end.result = text
            self.on_text(text + "\n")
        elif kind == "command_execution":
            self.tool(
                ident, "exec_command", {"command": item.get("command", "")},
                done=done, output=str(item.get("aggregated_output", "")),
                is_error=item.get("exit_code") not in (0, None) or item.get("status") == "failed",
            )  # fmt: skip
        elif kind == "file_change":
            changes = item.get("changes") or []
            self.tool(
                ident, "apply_patch", {"changes": changes}, done=done,
                output=str(item.get("status", "")), is_error=item.get("status") == "failed",
            )  # fmt: skip
        elif kind == "mcp_tool_call":
            result = item.get("result") or {}
            content = result.get("content") if isinstance(result, dict) else None
            output = (
                "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
                if isinstance(content, list)
                else ""
            )
            error = item.get("error")
            self.tool(
                ident, f"mcp__{item.get('server', '')}__{item.get('tool', '')}",
                item.get("arguments") or {}, done=done,
                output=output or str((error or {}).get("message", "") if isinstance(error, dict) else error or ""),
                is_error=bool(error) or item.get("status") == "failed",
            )  # fmt: skip
        elif kind == "error" and done:
            self.emit("cli_error", message=redact(str(item.get("message", ""))))

    def tool(
        self, ident: str, name: str, args: Any, *, done: bool, output: str, is_error: bool
    ) -> None:
        if not done:
            self.end_text()
            self.phase(AgentPhase.TOOL_USE)
            self.emit("tool_call", id=ident, name=name, input=redact_data(args))
            return
        self.emit(
            "tool_result", id=ident, name=name, output=redact(output)[:2000], is_error=is_error
        )


__all__ = ["FORWARDER", "CodexRunner"]
