from __future__ import annotations


class RepositoryError(Exception):
    """Base of the repos app's errors."""


class InvalidRepository(RepositoryError):
    """A repository's fields that cannot be used: a location that is neither an absolute path
    nor a URL, a path that is not a git repository, a branch it does not have, a duplicate
    name, an environment declaration that is not a YAML or JSON mapping."""


class RepositoryNotFound(RepositoryError):
    """No repository of that name or id."""


class RepositoryInUse(RepositoryError):
    """A repository that still has open quanta, goals or running waves cannot be removed."""
