from __future__ import annotations


class AnnihilationError(Exception):
    """Base of the core app's errors."""


class UnknownTopic(AnnihilationError):
    """An event was published on a topic that is not one of the documented topics."""


class BadSearchQuery(AnnihilationError):
    """A search query that cannot be turned into a full-text query (nothing to search for,
    only excluded terms, too long)."""


class NotFoundError(Exception):
    """Mixed into an app's error for a row that does not exist (beside the app's own base):
    a page answers it with a 404 (core.http.or_404)."""


class FieldError(Exception):
    """Mixed into an app's error about one field's value (beside the app's own base): `field`
    names it, so a form shows `problem` beside that field (core.forms.service_error_to_form);
    the message reads `<field>: <problem>` for the API and the command line."""

    def __init__(self, problem: str, *, field: str | None = None) -> None:
        self.problem, self.field = problem, field
        super().__init__(f"{field}: {problem}" if field else problem)
