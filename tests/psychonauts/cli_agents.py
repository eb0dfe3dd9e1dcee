"""Where the tests find the real agent CLIs: the pinned versions, installed by
`make cli-agents CLI_AGENTS_DIR=<folder>` into ANNIHILATION_CLI_AGENTS (default
~/.cache/annihilation/cli-agents; `make test` installs them there when npm reaches the
registry). A test that needs one and does not find it is skipped, saying how to install it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from psychonauts.executors.base import CLAUDE_CODE_VERSION, CODEX_VERSION

FOLDER = Path(
    os.environ.get(
        "ANNIHILATION_CLI_AGENTS", Path.home() / ".cache" / "annihilation" / "cli-agents"
    )
)
CLAUDE = FOLDER / "node_modules/@anthropic-ai/claude-code/bin/claude.exe"
CODEX_PACKAGE = FOLDER / "node_modules/@openai/codex/package.json"


def cli_agents_require(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip unless the CLI `name` (claude-code, codex) is installed; point the worker at it."""
    from psychonauts.executors.base import claude_binary, codex_binary

    monkeypatch.setenv("PSYCHONAUTS_CLI_AGENTS_DIR", str(FOLDER))
    monkeypatch.delenv("PSYCHONAUTS_CLAUDE_BIN", raising=False)
    monkeypatch.delenv("PSYCHONAUTS_CODEX_BIN", raising=False)
    binary, version = (
        (claude_binary(), CLAUDE_CODE_VERSION)
        if name == "claude-code"
        else (codex_binary(), CODEX_VERSION)
    )
    if not binary.is_file():
        pytest.skip(
            f"{name} {version} is not installed in {FOLDER}: run `make cli-agents "
            f"CLI_AGENTS_DIR={FOLDER}` (npm, ~400 MB) to run the tests of the {name} executor"
        )
