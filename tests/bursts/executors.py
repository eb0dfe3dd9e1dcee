"""A test executor behind the bursts executor seam (bursts.executor.EXECUTOR).

Behaviour comes from lines in the quantum's body, so each test states what its agents do:

    fail <role> <n>     the role's first n attempts on this quantum fail
    sleep <role> <s>    the role takes s seconds (stops early when its run is cancelled)
    steps <role> <n>    the role works in n checkpointed steps of `step_s` seconds each
    step_s <s>

Checkpointed steps append `<agent_run_id> <step>` to the file $BURSTS_TEST_STEP_LOG and resume
after the last step logged for the agent run: what a crashed worker's successor would do.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bursts.executor import Outcome
from bursts.models import AgentRun, AgentStatus


def _directives(body: str, role: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in body.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == role:
            found[parts[0]] = float(parts[2])
        elif len(parts) == 2 and parts[0] == "step_s":
            found["step_s"] = float(parts[1])
    return found


def _cancelled(agent_run_id: int) -> bool:
    return (
        AgentRun.objects.filter(pk=agent_run_id).values_list("status", flat=True).first()
        == AgentStatus.CANCELLED
    )


def _sleep(agent_run_id: int, seconds: float) -> bool:
    """Sleep, watching for cancellation; False when cancelled."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _cancelled(agent_run_id):
            return False
        time.sleep(min(0.05, max(end - time.monotonic(), 0)))
    return True


def scripted(*, agent_run_id: int) -> Outcome:
    agent = AgentRun.objects.select_related("quantum").get(pk=agent_run_id)
    todo = _directives(agent.quantum.body, agent.role)
    if not _sleep(agent_run_id, todo.get("sleep", 0)):
        return Outcome("cancelled", error="stopped: cancelled")
    steps = int(todo.get("steps", 0))
    if steps:
        log = Path(os.environ["BURSTS_TEST_STEP_LOG"])
        done = 0
        if log.exists():
            done = sum(
                1 for line in log.read_text().splitlines() if line.split()[0] == str(agent_run_id)
            )
        for step in range(done + 1, steps + 1):
            if not _sleep(agent_run_id, todo.get("step_s", 0.2)):
                return Outcome("cancelled", error="stopped: cancelled")
            with log.open("a") as fh:
                fh.write(f"{agent_run_id} {step}\n")
    earlier = AgentRun.objects.filter(
        quantum=agent.quantum, role=agent.role, pk__lt=agent.pk
    ).count()
    if earlier < todo.get("fail", 0):
        return Outcome("error", error=f"{agent.role} failed on purpose (attempt {earlier + 1})")
    return Outcome(
        "done", result=f"{agent.agent_id} did its part (context {len(agent.context)} chars)"
    )
