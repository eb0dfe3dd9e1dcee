"""The reflection app's errors: one base, each subclass named for what went wrong."""

from __future__ import annotations


class ReflectionError(Exception):
    """Base of the reflection app's errors."""


class NotFound(ReflectionError):
    """The rule, delta, skill use or reflection run named does not exist."""


class IllegalTransition(ReflectionError):
    """A status change its transition table does not allow from the row's current status."""


class InvalidRule(ReflectionError):
    """A rule or delta with empty text, an unknown kind or scope, or a delta without its rule."""
