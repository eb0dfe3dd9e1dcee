"""The environments' errors: all are PsychonautErrors, written for the operator."""

from __future__ import annotations

from psychonauts.errors import PsychonautError, SuspendRun


class EnvironmentProblem(PsychonautError):
    """Base of the environments' errors."""


class EnvironmentInvalid(EnvironmentProblem):
    """A declaration that cannot be used: not YAML, an unknown field, a bad value."""


class EnvironmentBuildFailed(EnvironmentProblem):
    """A build failed (a setup command failed, timed out, wrote too much, or the sandbox could
    not start). The message says why; the build's redacted log is on its row."""

    def __init__(self, message: str, *, build_id: int | None = None) -> None:
        super().__init__(message)
        self.build_id = build_id


class EnvironmentNotFound(EnvironmentProblem):
    """No environment build has that id."""


class EnvironmentWait(SuspendRun):
    """An agent suspended until its repository's environment is built (it holds no worker);
    the build's end resumes it."""
