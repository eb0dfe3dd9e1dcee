from __future__ import annotations


class AnnihilationError(Exception):
    """Base of the core app's errors."""


class UnknownTopic(AnnihilationError):
    """An event was published on a topic that is not one of the documented topics."""


class BadSearchQuery(AnnihilationError):
    """A search query that cannot be turned into a full-text query (nothing to search for,
    only excluded terms, too long)."""
