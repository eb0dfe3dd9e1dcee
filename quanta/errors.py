from __future__ import annotations

from core.errors import BadSearchQuery as CoreBadSearchQuery
from core.errors import FieldError


class QuantaError(Exception):
    """Base of the quanta app's errors. The message is written for the operator."""


class QuantumNotFound(QuantaError):
    """No quantum has that id."""


class InvalidQuantum(QuantaError, FieldError):
    """A field value is not acceptable (empty title, priority out of range, unknown kind ...)."""


class IllegalTransition(QuantaError):
    """The quantum's current status does not allow the requested change."""


class DependencyCycle(QuantaError):
    """Adding the `blocks` edge would close a cycle; the message names it."""


class DuplicateDependency(QuantaError):
    """That edge already exists."""


class DependencyNotFound(QuantaError):
    """No such edge to remove."""


class ImportFailed(QuantaError):
    """An import file is malformed; `problems` lists every one as `file:line: field: why`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class BadSearchQuery(QuantaError, CoreBadSearchQuery):
    """A search query that cannot be turned into a full-text query."""
