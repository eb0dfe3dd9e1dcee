from __future__ import annotations


class ApiError(Exception):
    """Base of the api app's errors. The message is written for the client."""


class InvalidToken(ApiError):
    """A token name or scope that cannot be used (empty name, unknown scope)."""


class TokenNotFound(ApiError):
    """No token has that id or prefix."""


class TokenAlreadyRevoked(ApiError):
    """The token is revoked already; nothing changed."""


class IdempotencyConflict(ApiError):
    """The key was used before with another request body (or on another operation)."""


class BadCursor(ApiError):
    """A pagination cursor this API did not hand out (or for another listing)."""
