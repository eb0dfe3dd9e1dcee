"""Where the agent CLIs are installed, and whether each executor can run here.

The CLIs are optional: `make cli-agents` installs pinned versions with npm into
`PSYCHONAUTS_CLI_AGENTS_DIR` (default `ANNIHILATION_HOME/cli-agents`). Nothing else needs them.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from psychonauts.errors import PsychonautError

OURS = "ours"
CLAUDE_CODE = "claude-code"
CODEX = "codex"
EXECUTORS = (OURS, CLAUDE_CODE, CODEX)

# The versions `make cli-agents` installs; the executors are tested against these. Claude Code's
# package is a native binary (Node is not used at run time).
CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"


class ExecutorError(PsychonautError):
    """An agent CLI could not run, or ended without a usable answer."""


@dataclass(frozen=True)
class ExecutorStatus:
    name: str
    available: bool
    detail: str


def cli_agents_dir() -> Path:
    configured = getattr(settings, "PSYCHONAUTS_CLI_AGENTS_DIR", "") or os.environ.get(
        "PSYCHONAUTS_CLI_AGENTS_DIR", ""
    )
    return Path(configured) if configured else Path(settings.ANNIHILATION_HOME) / "cli-agents"


def cli_state_root() -> Path:
    """Where the CLIs' per-agent state folders (their sessions) live:
    PSYCHONAUTS_CLI_STATE_DIR, default ANNIHILATION_HOME/cli-state. A folder every worker mounts
    (shared storage) lets a run resumed on another host continue the CLI's session there."""
    configured = getattr(settings, "PSYCHONAUTS_CLI_STATE_DIR", "") or os.environ.get(
        "PSYCHONAUTS_CLI_STATE_DIR", ""
    )
    return Path(configured) if configured else Path(settings.ANNIHILATION_HOME) / "cli-state"


def claude_binary() -> Path:
    """The Claude Code binary: PSYCHONAUTS_CLAUDE_BIN when set, else the pinned install's."""
    named = os.environ.get("PSYCHONAUTS_CLAUDE_BIN", "")
    if named:
        return Path(named)
    return cli_agents_dir() / "node_modules/@anthropic-ai/claude-code/bin/claude.exe"


def codex_binary() -> Path:
    """Codex's native binary (its npm package's Node launcher only starts it):
    PSYCHONAUTS_CODEX_BIN when set, else the pinned install's for this machine."""
    named = os.environ.get("PSYCHONAUTS_CODEX_BIN", "")
    if named:
        return Path(named)
    arch, target = {
        "aarch64": ("arm64", "aarch64-unknown-linux-musl"),
        "arm64": ("arm64", "aarch64-unknown-linux-musl"),
    }.get(platform.machine(), ("x64", "x86_64-unknown-linux-musl"))
    return cli_agents_dir() / f"node_modules/@openai/codex-linux-{arch}/vendor/{target}/bin/codex"


def _version(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return False, f"{argv[0]} does not start: {exc}"
    except subprocess.TimeoutExpired:
        return False, f"{argv[0]} --version did not answer in 30 s"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return False, f"{argv[0]} --version failed: {why[-1] if why else done.returncode}"
    return True, done.stdout.strip()


def executor_status(name: str) -> ExecutorStatus:
    """Whether `name` can run agents on this worker, and why not."""
    if name == OURS:
        return ExecutorStatus(name, True, "the runtime's own agent loop (always available)")
    if name == CLAUDE_CODE:
        binary = claude_binary()
        if not binary.is_file():
            return ExecutorStatus(
                name,
                False,
                f"Claude Code is not installed ({binary} missing): run `make cli-agents` "
                f"(npm install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION})",
            )
        ok, detail = _version([str(binary), "--version"])
        return ExecutorStatus(name, ok, f"{detail} at {binary}" if ok else detail)
    if name == CODEX:
        binary = codex_binary()
        if not binary.is_file():
            return ExecutorStatus(
                name,
                False,
                f"Codex is not installed ({binary} missing): run `make cli-agents` "
                f"(npm install @openai/codex@{CODEX_VERSION})",
            )
        ok, detail = _version([str(binary), "--version"])
        return ExecutorStatus(name, ok, f"{detail} at {binary}" if ok else detail)
    return ExecutorStatus(name, False, f"unknown executor {name!r} (known: {', '.join(EXECUTORS)})")


def executors_status() -> list[ExecutorStatus]:
    return [executor_status(name) for name in EXECUTORS]
