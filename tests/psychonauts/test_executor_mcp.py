"""Our tools over MCP for an agent CLI: the official MCP client (`mcp` SDK) starts the same stdio
bridge an agent CLI starts inside the sandbox, and calls our tools through the unix socket."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from psychonauts.executors.mcp import McpTools, Suspension, mcp_tool_names
from psychonauts.models import DiaryEntry, Mail, ToolCall
from psychonauts.runtime.tools import ToolContext
from psychonauts.runtime.verification import verdict_find
from tests.psychonauts.stages import staged_run
from tether.models import Reaching
from tether.services import reaching_answer

# The server answers from its own threads (their own connections): committed data.
pytestmark = pytest.mark.django_db(transaction=True)


def _context(run: Any, workspace: Path) -> ToolContext:
    return ToolContext(
        agent_run_id=run.pk, agent_id=run.agent_id, attempt=run.attempt,
        quantum_id=run.quantum_id, role=run.role, depth=run.depth, workspace=workspace,
        shared=False, turn_index=0,
    )  # fmt: skip


def _session(tools: McpTools, calls: Callable[[ClientSession], Any], *, timeout: float = 60) -> Any:
    """Run `calls` in an MCP client session over the bridge, as a CLI does."""
    config = tools.config(tools.socket)
    params = StdioServerParameters(command=config["command"], args=config["args"])

    async def main() -> Any:
        with anyio.fail_after(timeout):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                return await calls(s)

    return anyio.run(main)


def test_the_cli_lists_and_calls_our_tools_recorded_as_the_run_s_calls(
    repo, make_quantum, tmp_path
):
    run = staged_run(make_quantum(), "reviewer")
    allowed = ["read_file", "diary", "mail_send", "report_verdict"]
    names = mcp_tool_names(allowed)
    assert names == ["report_verdict", "diary", "mail_send"]
    suspensions: list[Suspension] = []

    async def calls(s: ClientSession) -> list[Any]:
        listed = await s.list_tools()
        return [
            [t.name for t in listed.tools],
            await s.call_tool("diary", {"kind": "decision", "text": "kept the old API"}),
            await s.call_tool("mail_send", {"to": "coder", "body": "look at x.py"}),
            await s.call_tool("report_verdict", {"verdict": "fail", "reasons": "x.py:3 is off"}),
            await s.call_tool("diary", {"kind": "nonsense", "text": "x"}),
            await s.call_tool("shell", {"command": "touch pwned"}),
        ]

    with McpTools(
        _context(run, tmp_path), names=names, allowed=allowed, on_suspend=suspensions.append
    ) as tools:
        listed, diary, mail, verdict, bad, shell = _session(tools, calls)

    assert listed == names
    assert not diary.is_error and diary.content[0].text == "noted (decision)"
    assert DiaryEntry.objects.get(agent_run=run).text == "kept the old API"
    assert not mail.is_error and Mail.objects.get(recipient="coder").body == "look at x.py"
    assert "verdict recorded: fail" in verdict.content[0].text
    # The verdict is found as our own loop's is: the run's last successful report_verdict.
    found = verdict_find(agent_run_id=run.pk)
    assert found is not None and (found.verdict, found.reasons) == ("fail", "x.py:3 is off")
    assert bad.is_error and "invalid arguments for diary" in bad.content[0].text
    # A tool the role does not get over MCP is refused, not run.
    assert shell.is_error and "unknown tool 'shell'" in shell.content[0].text
    assert not (tmp_path / "pwned").exists()
    recorded = list(ToolCall.objects.filter(agent_run=run).order_by("id"))
    assert [(c.name, c.completed, c.is_error) for c in recorded] == [
        ("diary", True, False),
        ("mail_send", True, False),
        ("report_verdict", True, False),
        ("diary", True, True),
    ]
    assert suspensions == []
    assert not tools.socket.exists()  # gone with the execution


def test_ask_tether_suspends_the_run_and_leaves_its_call_pending(repo, make_quantum, tmp_path):
    run = staged_run(make_quantum(), "coder")
    allowed = ["ask_tether", "diary"]
    suspensions: list[Suspension] = []

    async def calls(s: ClientSession) -> list[Any]:
        asked = await s.call_tool(
            "ask_tether", {"question": "Keep the old API?", "assumption": "keep it"}
        )
        after = await s.call_tool("diary", {"kind": "decision", "text": "x"})
        return [asked, after]

    with McpTools(
        _context(run, tmp_path),
        names=mcp_tool_names(allowed),
        allowed=allowed,
        on_suspend=suspensions.append,
    ) as tools:
        asked, after = _session(tools, calls)

    assert [s.name for s in suspensions] == ["ask_tether"]
    assert tools.suspension == suspensions[0]
    assert "waiting on the Tether" in asked.content[0].text
    # Suspended: no call is taken after the question (the runner is stopping the CLI).
    assert after.is_error and "suspended" in after.content[0].text
    reaching = Reaching.objects.get(agent_run=run)
    assert (reaching.status, reaching.question) == ("pending", "Keep the old API?")
    call = ToolCall.objects.get(agent_run=run)
    assert (call.name, call.completed, call.tool_use_id) == (
        "ask_tether",
        False,
        suspensions[0].tool_use_id,
    )


def test_a_permission_prompt_waits_on_the_tether_and_its_no_denies_that_use(
    repo, make_quantum, tmp_path
):
    run = staged_run(make_quantum(), "coder")
    asked = {"tool_name": "Bash", "input": {"command": "curl example.com"}}
    suspensions: list[Suspension] = []

    async def ask(s: ClientSession) -> Any:
        return await s.call_tool("permission_prompt", asked)

    def tools() -> McpTools:
        return McpTools(
            _context(run, tmp_path), names=[], allowed=[], on_suspend=suspensions.append,
            permissions=True,
        )  # fmt: skip

    with tools() as first:
        _session(first, ask)
    assert [s.name for s in suspensions] == ["permission_prompt"]
    reaching = Reaching.objects.get(agent_run=run, status="pending")
    assert "permission to use Bash" in reaching.question and "curl example.com" in reaching.question
    reaching_answer(reaching_id=reaching.pk, text="no, no network")

    # The CLI asks again (its session resumed): the answer decides, nothing is asked twice.
    with tools() as second:
        denied = _session(second, ask)
    decision = json.loads(denied.content[0].text)
    assert decision["behavior"] == "deny" and "no, no network" in decision["message"]
    assert Reaching.objects.filter(agent_run=run).count() == 1
    assert len(suspensions) == 1
