from __future__ import annotations


class BurstsError(Exception):
    """Base of the bursts app's errors. The message is written for the operator."""


class InvalidWave(BurstsError):
    """A wave cannot start as asked (a label no quantum could carry); the message names it."""


class WaveNotFound(BurstsError):
    """No wave has that id."""


class WaveNotRunning(BurstsError):
    """The wave already ended (done, cancelled or failed); it cannot be changed."""
