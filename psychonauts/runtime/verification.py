"""What decides an agent's end besides its own word: the quantum's verify commands (an implementing
stage with `verify: true`) and the verdict of a reviewing role (`report_verdict`).

This module writes the Verification rows; the runner (`psychonauts.runtime.runner`) calls it
when an agent gives its final answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict

from django.db import transaction

from bursts.models import AgentRun, QuantumRun
from bursts.services.stages import stage_spec
from psychonauts.containment.verify import VerifyReport
from psychonauts.models import ToolCall, Verification
from psychonauts.routing.providers.base import TextBlock
from psychonauts.runtime.checkpoint import turn_feedback
from psychonauts.runtime.tools import VERDICT_TOOL, VERDICTS
from quanta.events import quanta_event

VERIFY_RETRIES_DEFAULT = 2
VERIFY_RETRIES_MAX = 5


@dataclass(frozen=True)
class StageChecks:
    """A run's stage options that decide its end (read from the run's pipeline snapshot).

    `verify`: run the quantum's verify commands on the final answer; `retries`: how many failed
    rounds go back to the agent before the run fails; `verdict_blocks`: a `fail` verdict fails
    the run (else it ends done and the reasons become a comment on the quantum)."""

    verify: bool = False
    retries: int = VERIFY_RETRIES_DEFAULT
    verdict_blocks: bool = True


def stage_checks(run: AgentRun) -> StageChecks:
    """The options of the run's stage; a standalone run or a sub-agent has no stage (nothing is
    verified, a verdict blocks). Snapshots older than these options lack them: defaults."""
    if run.quantum_run_id is None or run.depth > 0:
        return StageChecks()
    quantum_run = QuantumRun.objects.only("pipeline_snapshot", "current_stage").get(
        pk=run.quantum_run_id
    )
    try:
        options: Mapping[str, object] = stage_spec(quantum_run, run.stage_index)
    except (KeyError, IndexError, TypeError):
        return StageChecks()
    retries = options.get("verify_retries", VERIFY_RETRIES_DEFAULT)
    if not isinstance(retries, int) or isinstance(retries, bool):
        retries = VERIFY_RETRIES_DEFAULT
    return StageChecks(
        verify=options.get("verify", False) is True,
        retries=max(0, min(VERIFY_RETRIES_MAX, retries)),
        verdict_blocks=options.get("verdict", "block") != "comment",
    )


# --- verification ---------------------------------------------------------------------------


class CheckBrief(TypedDict):
    command: str
    passed: bool
    reason: str


class VerificationEvent(TypedDict):
    """The payload of a `verification` event (on `agent:<id>` and on `quanta`)."""

    agent_run_id: int
    agent_id: str
    quantum_id: int
    verification_id: int
    round: int
    passed: bool
    commit: str
    checks: list[CheckBrief]
    # what comes of it: done (passed), retry (fed back to the agent), failed (the run fails)
    then: Literal["done", "retry", "failed"]


def verification_round(*, agent_run_id: int) -> int:
    """The number the run's next verification gets (rounds count from 1)."""
    return Verification.objects.filter(agent_run_id=agent_run_id).count() + 1


def feedback_message(report: VerifyReport, *, commit: str, round: int, retries: int) -> str:
    """The corrective user message of a failed round: what passed, what failed and why."""
    left = retries - round + 1
    return (
        f"Verification failed (round {round}): the quantum's verify commands ran on your commit "
        f"{commit[:10] or '(none)'} and {len(report.failed)} of {len(report.checks)} failed.\n"
        "Fix the failures without breaking the checks that passed, then give your final answer "
        f"again; the commands run again then ({left} more failed round(s) and the run fails).\n\n"
        + report.summary()
    )


def failure_reason(report: VerifyReport, *, commit: str, round: int) -> str:
    """The error of a run whose verification still failed after its retries."""
    return (
        f"verification failed after {round} round(s) on commit {commit[:10] or '(none)'}:\n"
        + report.summary()
    )


@transaction.atomic
def verification_record(
    *,
    run: AgentRun,
    round: int,
    report: VerifyReport,
    commit_sha: str,
    feedback_turn_id: int | None,
    feedback: str,
) -> tuple[Verification, VerificationEvent]:
    """Store a round's result; with `feedback_turn_id`, in the same transaction the corrective
    message as that final turn's reply, so a crash never keeps one without the other (a resumed
    run either verifies again as the same round, or goes on with the message).

    Publishes the round on `quanta` (the quantum page); the runner publishes the returned payload
    on the agent's topic with its own events."""
    verification = Verification.objects.create(
        agent_run_id=run.pk,
        quantum_id=run.quantum_id,
        round=round,
        passed=report.passed,
        checks=report.as_data(),
        commit_sha=commit_sha,
    )
    if feedback_turn_id is not None:
        turn_feedback(turn_id=feedback_turn_id, content=[TextBlock(type="text", text=feedback)])
    then: Literal["done", "retry", "failed"] = (
        "done" if report.passed else "retry" if feedback_turn_id is not None else "failed"
    )
    payload = VerificationEvent(
        agent_run_id=run.pk,
        agent_id=run.agent_id,
        quantum_id=run.quantum_id,
        verification_id=verification.pk,
        round=round,
        passed=report.passed,
        commit=commit_sha,
        checks=[
            CheckBrief(command=c.command, passed=c.passed, reason=c.reason) for c in report.checks
        ],
        then=then,
    )
    quanta_event("verification", payload)
    return verification, payload


# --- verdicts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    verdict: Literal["pass", "fail"]
    reasons: str

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


def verdict_find(*, agent_run_id: int) -> Verdict | None:
    """The run's verdict: its last successful `report_verdict` call (a refused call is none)."""
    call = (
        ToolCall.objects.filter(
            agent_run_id=agent_run_id, name=VERDICT_TOOL, completed=True, is_error=False
        )
        .order_by("-turn_index", "-id")
        .only("input")
        .first()
    )
    if call is None:
        return None
    verdict, reasons = call.input.get("verdict"), call.input.get("reasons")
    if verdict not in VERDICTS or not isinstance(reasons, str):
        return None
    return Verdict("pass" if verdict == "pass" else "fail", reasons)
