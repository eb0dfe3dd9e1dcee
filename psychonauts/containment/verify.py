"""A quantum's verify commands, run in a worktree through the agent sandbox.

The agent runtime runs them when an implementing stage ends (and feeds failures back to the
agent); the merge queue runs them on a merged result before the target branch moves. Each
command is judged by the command guard first, runs with the verify timeout, and its output is
stored redacted and cut to the tool output limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from django.conf import settings

from core.redaction import redact
from psychonauts.containment.guard import command_judge
from psychonauts.containment.sandbox import SandboxEnvironment, SandboxUnavailable, sandbox_run
from psychonauts.environments.errors import EnvironmentProblem
from psychonauts.environments.services import workspace_environment
from psychonauts.runtime.tools import truncate


class CheckData(TypedDict):
    command: str
    passed: bool
    returncode: int | None
    reason: str
    output: str
    elapsed_s: float


@dataclass(frozen=True)
class Check:
    """One verify command's result. `reason` says why it failed ("" when it passed)."""

    command: str
    passed: bool
    returncode: int | None  # None: it did not run (refused, no sandbox)
    reason: str
    output: str
    elapsed_s: float

    def as_data(self) -> CheckData:
        return CheckData(
            command=self.command,
            passed=self.passed,
            returncode=self.returncode,
            reason=self.reason,
            output=self.output,
            elapsed_s=self.elapsed_s,
        )


@dataclass(frozen=True)
class VerifyReport:
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    def summary(self) -> str:
        """The checks that passed and those that failed, each failure with its reason and
        output: what an agent fixing them, or an operator reading why, needs."""
        lines = [f"- PASSED: `{c.command}`" for c in self.checks if c.passed]
        for check in self.failed:
            lines.append(f"- FAILED: `{check.command}` ({check.reason})")
            if check.output.strip():
                lines.append("```\n" + check.output.strip() + "\n```")
        return "\n".join(lines)

    def as_data(self) -> list[CheckData]:
        return [check.as_data() for check in self.checks]


def verify_command_problem(command: str) -> str:
    """Why the command guard refuses a verify command, or "" when it may run."""
    verdict = command_judge(command, allow=settings.PSYCHONAUTS_COMMAND_ALLOW)
    return "" if verdict.allowed else verdict.reason


def _check(
    command: str,
    *,
    workspace: Path,
    quantum_id: int,
    timeout_s: float,
    environment: SandboxEnvironment | None,
) -> Check:
    problem = verify_command_problem(command)
    if problem:
        return Check(command, False, None, problem, "", 0.0)
    try:
        result = sandbox_run(
            command,
            workspace=workspace,
            quantum_id=quantum_id,
            timeout_s=timeout_s,
            environment=environment,
        )
    except SandboxUnavailable as exc:
        return Check(command, False, None, str(exc), "", 0.0)
    if result.stopped == "timeout":
        reason = f"timed out after {timeout_s:g}s"
    elif result.stopped == "output":
        reason = "stopped: too much output"
    elif result.stopped in ("memory", "worktree"):
        reason = f"stopped: {result.detail}"
    elif result.returncode != 0:
        reason = f"exit status {result.returncode}"
    else:
        reason = ""
    output = truncate(redact(result.output))
    return Check(command, not reason, result.returncode, reason, output, result.elapsed_s)


def verify_commands_run(
    commands: Sequence[str], *, workspace: Path, quantum_id: int, timeout_s: float | None = None
) -> VerifyReport:
    """Run every command (all of them, even after a failure: the report lists each one's
    result) in the workspace's sandbox, as quantum `quantum_id`'s commands run, in the
    repository's environment of the workspace's commit (built first when it is not: a commit
    that changes a key file is checked with what that key installs). An environment that
    cannot be had fails every command with its reason."""
    limit = settings.VERIFY_TIMEOUT_S if timeout_s is None else timeout_s
    if not commands:
        return VerifyReport(())
    try:
        environment = workspace_environment(workspace)
    except EnvironmentProblem as exc:
        return VerifyReport(
            tuple(Check(c, False, None, f"no environment: {exc}", "", 0.0) for c in commands)
        )
    mount = environment.mount() if environment is not None else None
    return VerifyReport(
        tuple(
            _check(
                command,
                workspace=workspace,
                quantum_id=quantum_id,
                timeout_s=limit,
                environment=mount,
            )
            for command in commands
        )
    )
