"""The forges app's errors: one base, each subclass says what the caller does about it."""

from __future__ import annotations


class ForgeError(Exception):
    """Anything the forges app refuses or cannot do."""


class ForgeNotConfigured(ForgeError):
    """The repository publishes no pull requests, or its credential is missing on this worker."""


class ForgeRefused(ForgeError):
    """The forge said no for a reason trying again will not change (403 without a rate limit,
    404, 422 other than "already exists"): recorded on the pull request for the operator."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ForgeUnavailable(ForgeError):
    """The forge could not be reached or answered 5xx (or rate-limited us) after the client's own
    retries: the task is retried later with backoff, the call being idempotent."""

    def __init__(self, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
