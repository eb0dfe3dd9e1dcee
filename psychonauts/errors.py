from __future__ import annotations


class PsychonautError(Exception):
    """Base of the psychonauts app's errors. The message is written for the operator."""


class InvalidDefinition(PsychonautError):
    """A role or script YAML is malformed; the message names the file, line and field."""


class RoleNotFound(PsychonautError):
    """No role has that name."""


class AgentRunNotFound(PsychonautError):
    """No agent run has that id."""


class ProviderError(PsychonautError):
    """The provider failed for good (after its retries); the run ends in `error`."""


# How the error of a run that infrastructure ended begins (reflection reads it: no lesson).
INFRASTRUCTURE = "infrastructure error: "


class InfrastructureError(ProviderError):
    """What failed is the machinery around the agent (the model's server, its limits), not the
    agent's work: nothing to learn from it about how agents should work. The run's error begins
    with INFRASTRUCTURE."""


class ContextOverflow(InfrastructureError):
    """The model's server refused a request longer than the model's context."""


class CallPastDeadline(PsychonautError):
    """A model call was still streaming when its agent run's time (the role's `timeout_s`) ran
    out: a model that keeps answering slowly is stopped there, not at the end of its answer."""


class UnknownProvider(PsychonautError):
    """No provider is registered under that name."""


class ToolFailure(PsychonautError):
    """A tool refused or failed; the message goes back to the model as a tool error."""


class PathEscape(ToolFailure):
    """A path leaves the workspace (`..`, absolute, or a symlink pointing out)."""


class CommandRefused(ToolFailure):
    """The command guard refused a shell command (danger tier, or caution without a rule)."""


class LeaseConflict(ToolFailure):
    """Another agent holds a conflicting lease on the file, or the writer holds none."""


class SpawnRefused(ToolFailure):
    """A spawn would exceed the depth limit or names an unknown role."""


class SlotTimeout(ToolFailure):
    """No recursion-semaphore slot became free within the wait limit."""


class BudgetExceeded(PsychonautError):
    """The next provider call would take the quantum run or the wave over its budget."""


class WorkspaceError(PsychonautError):
    """git refused to create or commit a workspace."""


class SuspendRun(PsychonautError):
    """Raised by a tool (ask_tether) to checkpoint and suspend the run without holding a worker.

    The pending tool call stays uncompleted; whoever resumes the run records its output
    (`tool_call_complete`) first, then executes the run again.
    """


class RateLimitWait(SuspendRun):
    """An endpoint refused a model call for load and asked to wait longer than a worker waits
    (ENDPOINTS_RETRY_AFTER_MAX_S): the run is suspended, holding no worker, and woken when the
    wait is over (`psychonauts.routing.ratelimits`). The refused call made no turn: it is asked again."""

    def __init__(self, message: str, *, wait_s: float) -> None:
        super().__init__(message)
        self.wait_s = wait_s
