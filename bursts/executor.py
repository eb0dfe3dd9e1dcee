"""The one seam between the burst manager and whatever runs an agent.

The stage tasks call `execute_agent(agent_run_id)`, which calls the executor registered in
`EXECUTOR`: the agent runtime registers `psychonauts.runtime.entry.agent_run` there when the
apps load (psychonauts/hooks.py); tests install their own for a test (tests/bursts/conftest.py).
`settings.BURSTS_EXECUTOR = "noop"` finishes every agent at once instead (benchmarks of the
manager alone). Whatever answers must be idempotent for the same agent run and stop when it sees
the AgentRun cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict

from django.conf import settings

from core import metrics
from core.hooks import Hook

# "stale": this execution lost the run to another one (taken over on another host while it was
# presumed dead; psychonauts/workspaces/central.py): the row is the other execution's, nothing is recorded.
OutcomeStatus = Literal["done", "error", "waiting", "cancelled", "stale"]


class OutcomeDict(TypedDict):
    status: OutcomeStatus
    result: str
    error: str


@dataclass(frozen=True)
class Outcome:
    """How one execution of an agent run ended: `result` is the final answer of a `done` run;
    `error` says why any other run did not finish (its failure, what a `waiting` run waits for)."""

    status: OutcomeStatus
    result: str = ""
    error: str = ""

    def as_dict(self) -> OutcomeDict:
        return {"status": self.status, "result": self.result, "error": self.error}


class Executor(Protocol):
    """Runs (or resumes) one agent run to its outcome."""

    def __call__(self, *, agent_run_id: int) -> Outcome: ...


# The executor of every agent run: one, registered by the agent runtime (psychonauts/hooks.py).
EXECUTOR: Hook[Executor] = Hook("bursts.executor", single=True)


def noop_executor(*, agent_run_id: int) -> Outcome:
    """Finishes at once (settings.BURSTS_EXECUTOR = "noop")."""
    return Outcome(status="done", result=f"noop agent run {agent_run_id}")


def executor_current() -> Executor:
    """What runs the agents of this process's waves: noop when the setting says so, else the
    registered executor (HookEmpty when none is)."""
    return noop_executor if settings.BURSTS_EXECUTOR == "noop" else EXECUTOR.one()


@metrics.timed_execution
def execute_agent(agent_run_id: int) -> Outcome:
    """Run (or resume) one agent run to an outcome. Exceptions become an `error` outcome."""
    executor = executor_current()
    try:
        return executor(agent_run_id=agent_run_id)
    except Exception as exc:
        return Outcome(status="error", error=f"{type(exc).__name__}: {exc}")
