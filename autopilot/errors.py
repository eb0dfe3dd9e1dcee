"""What the autopilot refuses, each with a message for the operator."""

from __future__ import annotations

from core.errors import FieldError, NotFoundError


class AutopilotError(Exception):
    """Base of the autopilot's refusals."""


class GoalNotFound(AutopilotError, NotFoundError):
    pass


class InvalidGoal(AutopilotError, FieldError):
    """A goal's fields are not acceptable (the message names the field)."""


class IllegalGoalTransition(AutopilotError):
    """The goal is not in a status the requested change can start from."""


class InvalidPlan(AutopilotError):
    """A planner's decomposition is not acceptable (the message lists every problem)."""


class InvalidHubCommand(AutopilotError):
    """A pause, resume or force the hub cannot take (unknown state, ...)."""
