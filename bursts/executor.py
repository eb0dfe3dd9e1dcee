"""The one seam between the burst manager and whatever runs an agent.

The stage tasks call `execute_agent(agent_run_id)`; which executor answers is a setting:
`psychonauts` (the agent runtime: `psychonauts.runtime.execute.agent_run_execute`), `noop` (finishes at
once, for benchmarks), or a dotted path to a callable (tests). Whatever answers must be
idempotent for the same agent run and stop when it sees the AgentRun cancelled.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, TypedDict

from django.conf import settings

from bursts.errors import ExecutorMisconfigured
from core import metrics

# "stale": this execution lost the run to another one (taken over on another host while it was
# presumed dead; psychonauts/workspaces/central.py): the row is the other execution's, nothing is recorded.
OutcomeStatus = Literal["done", "error", "waiting", "cancelled", "stale"]
OUTCOME_STATUSES: frozenset[str] = frozenset({"done", "error", "waiting", "cancelled", "stale"})


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


def _noop(agent_run_id: int) -> Outcome:
    return Outcome(status="done", result=f"noop agent run {agent_run_id}")


@cache
def _resolve(name: str) -> Callable[..., Any]:
    if name == "noop":
        return _noop
    if name == "psychonauts":
        name = "psychonauts.runtime.execute.agent_run_execute"
    module_name, _, attr = name.rpartition(".")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ExecutorMisconfigured(f"BURSTS_EXECUTOR={name!r}: {exc}") from None
    if not callable(func):
        raise ExecutorMisconfigured(f"BURSTS_EXECUTOR={name!r} is not callable")
    return func  # type: ignore[no-any-return]


def _normalise(raw: Any) -> Outcome:
    """An Outcome from whatever the executor returned: an Outcome, or a mapping or object with
    the same keys (an executor named by a dotted path may return either)."""
    get = raw.get if isinstance(raw, dict) else (lambda key, default="": getattr(raw, key, default))
    status = str(get("status", "error"))
    if status not in OUTCOME_STATUSES:
        return Outcome(status="error", error=f"executor returned unknown status {status!r}")
    return Outcome(
        status=status,  # type: ignore[arg-type]
        result=str(get("result", "") or ""),
        error=str(get("error", "") or ""),
    )


@metrics.timed_execution
def execute_agent(agent_run_id: int) -> Outcome:
    """Run (or resume) one agent run to an outcome. Exceptions become an `error` outcome."""
    func = _resolve(settings.BURSTS_EXECUTOR)
    try:
        raw = func(agent_run_id=agent_run_id)
    except Exception as exc:
        return Outcome(status="error", error=f"{type(exc).__name__}: {exc}")
    return _normalise(raw)
