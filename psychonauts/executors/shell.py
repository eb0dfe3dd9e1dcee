"""`shell`: runs a trivial quantum's mechanical steps without a model.

The steps are the shell commands the quantum's body gives (`quanta.complexity`). Every agent of
the quantum's pipeline runs on this provider (routing, `psychonauts.runtime.execute`), and it
answers the way a model would, so that everything goes through the runtime's normal paths:

- A role that may run `shell` (an implementer): its first turn asks for one `shell` call per
  step, so each goes through the command guard and the sandbox and is recorded as a tool call;
  its next turn sums up and the runtime commits the work (and, in a `verify` stage, runs the
  quantum's verify commands). A step that was refused or exited non-zero ends the run in error
  (`StepsFailed`) with what went wrong, before anything is committed.
- A role that ends with a verdict (`report_verdict`): its first turn runs the quantum's verify
  commands through `shell`, its next reports `pass` when all of them exited 0, else `fail` with
  their output. With no verify commands it says so and passes only when the steps ran (a done
  run of this provider on the quantum ran them).
- Any other role (read-only, such as the planner) ends at once with the list of steps.

Its answers cost nothing: no tokens, model `shell`.
"""

from __future__ import annotations

import re
from typing import Any

from bursts.models import AgentStatus
from psychonauts.errors import PsychonautError
from psychonauts.models import ToolCall
from psychonauts.routing.providers.base import (
    ContentBlock,
    Message,
    OnText,
    ProviderRequest,
    ProviderResponse,
)
from psychonauts.runtime.tools import TOOLS, VERDICT_REASONS_MAX, VERDICT_TOOL
from quanta.complexity import complexity_classify
from quanta.models import Quantum

MODEL = "shell"
STEP_ID = "shell_step_"
CHECK_ID = "shell_check_"
VERDICT_ID = "shell_verdict"
OUTPUT_SHOWN = 1500  # characters of a failed step's or check's output in a summary

_EXIT = re.compile(r"^exit (-?\d+) ")


class StepsFailed(PsychonautError):
    """A mechanical step was refused or failed: the run ends in error with what happened. Not a
    ProviderError: the steps failed, not an endpoint."""


class ShellProvider:
    name = "shell"
    uses_llm = False

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        tools = {t["name"] for t in request.tools}
        if tools >= set(TOOLS.keys()):
            # A role that lists no tools has them all: an implementer, not a reviewer (the
            # runtime weighs a verdict only from a role that names the verdict tool).
            tools.discard(VERDICT_TOOL)
        quantum = Quantum.objects.only("title", "body", "verify_commands").get(
            pk=request.run.quantum_id
        )
        steps = complexity_classify(quantum.title, quantum.body).steps
        last = _last_assistant(request.messages)
        results = _results(request.messages)
        if last is None:  # the first turn
            if VERDICT_TOOL in tools:
                return self._checks(request, quantum, tools, on_text)
            if "shell" in tools and steps:
                return _answer(
                    on_text,
                    f"Running {len(steps)} mechanical step(s) without a model.",
                    [_shell(f"{STEP_ID}{i}", step) for i, step in enumerate(steps)],
                )
            return _answer(on_text, _listing(steps, request.run.role))
        asked = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_use"]
        if results is None:
            # No tool results after our last answer: the runtime's verification failed and its
            # feedback is the reply. Running the same steps again cannot change the outcome.
            feedback = _text_of(request.messages[-1]["content"])
            raise StepsFailed(
                "the quantum's verify commands failed after its mechanical steps, which a run "
                "without a model cannot correct:\n" + feedback[:OUTPUT_SHOWN]
            )
        if any(b.get("name") == VERDICT_TOOL for b in asked):
            return _answer(on_text, "Verdict reported from the quantum's verify commands.")
        if any(str(b.get("id", "")).startswith(CHECK_ID) for b in asked):
            return self._verdict(asked, results, on_text)
        return self._summary(asked, results, on_text)

    # the turns ------------------------------------------------------------------------------
    def _checks(
        self, request: ProviderRequest, quantum: Quantum, tools: set[str], on_text: OnText
    ) -> ProviderResponse:
        commands = list(quantum.verify_commands or [])
        if commands and "shell" in tools:
            return _answer(
                on_text,
                f"Running the quantum's {len(commands)} verify command(s).",
                [_shell(f"{CHECK_ID}{i}", c) for i, c in enumerate(commands)],
            )
        why = "no checks given" if not commands else "no shell to run the checks with"
        if _steps_ran(quantum_id=quantum.pk, agent_run_id=request.run.agent_run_id):
            verdict, reasons = "pass", f"{why}; the mechanical steps ran and exited 0"
        else:
            verdict, reasons = "fail", f"{why}, and no run of the mechanical steps was found"
        return _answer(on_text, f"Verdict: {verdict} ({why}).", [_verdict(verdict, reasons)])

    def _verdict(
        self, asked: list[dict[str, Any]], results: dict[str, dict[str, Any]], on_text: OnText
    ) -> ProviderResponse:
        failed = _failures(asked, results)
        if not failed:
            commands = [str(b["input"].get("command", "")) for b in asked]
            reasons = f"all {len(commands)} verify command(s) passed: " + "; ".join(commands)
            verdict = "pass"
        else:
            verdict, reasons = "fail", "verify commands failed:\n" + "\n".join(failed)
        reasons = reasons[:VERDICT_REASONS_MAX]
        return _answer(on_text, f"Verdict: {verdict}.", [_verdict(verdict, reasons)])

    def _summary(
        self, asked: list[dict[str, Any]], results: dict[str, dict[str, Any]], on_text: OnText
    ) -> ProviderResponse:
        failed = _failures(asked, results)
        if failed:
            raise StepsFailed(
                f"{len(failed)} of {len(asked)} mechanical step(s) failed:\n" + "\n".join(failed)
            )
        done = "\n".join(f"- {b['input'].get('command', '')}" for b in asked)
        return _answer(on_text, f"Ran {len(asked)} mechanical step(s), each exited 0:\n{done}")


# helpers ------------------------------------------------------------------------------------
def _answer(on_text: OnText, text: str, uses: list[ContentBlock] | None = None) -> ProviderResponse:
    on_text(text)
    content: list[ContentBlock] = [{"type": "text", "text": text}, *(uses or [])]
    return ProviderResponse(content, "tool_use" if uses else "end_turn", model=MODEL)


def _shell(use_id: str, command: str) -> ContentBlock:
    return {"type": "tool_use", "id": use_id, "name": "shell", "input": {"command": command}}


def _verdict(verdict: str, reasons: str) -> ContentBlock:
    return {
        "type": "tool_use",
        "id": VERDICT_ID,
        "name": VERDICT_TOOL,
        "input": {"verdict": verdict, "reasons": reasons},
    }


def _last_assistant(messages: list[Message]) -> list[Any] | None:
    for message in reversed(messages):
        if message["role"] == "assistant":
            content = message["content"]
            return content if isinstance(content, list) else [{"type": "text", "text": content}]
    return None


def _results(messages: list[Message]) -> dict[str, dict[str, Any]] | None:
    """The tool results the last message holds, by tool use id; None when it holds none."""
    if len(messages) < 2 or messages[-1]["role"] != "user":
        return None
    content = messages[-1]["content"]
    if not isinstance(content, list):
        return None
    found = {
        str(b.get("tool_use_id")): b
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }
    return found or None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("text")
    )


def _failures(asked: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> list[str]:
    """One line (and the output) per call that was refused, failed or exited non-zero."""
    failed = []
    for use in asked:
        result = results.get(str(use.get("id")))
        command = str(use.get("input", {}).get("command", ""))
        if result is None:
            failed.append(f"$ {command}\n  (no result)")
            continue
        output = str(result.get("content", ""))
        match = _EXIT.match(output)
        if result.get("is_error") or match is None or match.group(1) != "0":
            failed.append(f"$ {command}\n{output[:OUTPUT_SHOWN]}")
    return failed


def _listing(steps: tuple[str, ...], role: str) -> str:
    if not steps:
        return f"No mechanical steps to list for the {role}."
    lines = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    return f"Mechanical steps, run without a model by the implementing stage:\n{lines}"


def _steps_ran(*, quantum_id: int, agent_run_id: int) -> bool:
    """Whether a run of this provider on the quantum ended done after running its steps."""
    return (
        ToolCall.objects.filter(
            agent_run__quantum_id=quantum_id,
            agent_run__provider=ShellProvider.name,
            agent_run__status=AgentStatus.DONE,
            name="shell",
            tool_use_id__startswith=STEP_ID,
            completed=True,
            is_error=False,
        )
        .exclude(agent_run_id=agent_run_id)
        .exists()
    )
