from __future__ import annotations

from core.errors import NotFoundError


class TetherError(Exception):
    """Base of the tether app's errors. The message is written for the operator."""


class NotFound(TetherError, NotFoundError):
    """No reaching, drift, change review or pipeline mutation has that id."""


class AlreadyDecided(TetherError):
    """The item is no longer in a state that allows the action (answered twice, grounded
    twice, an answer to a cancelled reaching ...). Nothing was changed."""


class BranchMoved(TetherError):
    """The change's branch moved or vanished since it was reviewed: approve nothing unseen."""


class InvalidProposal(TetherError):
    """A proposed pipeline is malformed or does not match the pipeline it names."""


class InvalidInput(TetherError):
    """An empty answer or reason, or another value the operator must fix."""


class QuestionWithdrawn(AlreadyDecided):
    """The question no longer applies (its quantum left the state it asked about): an answer to
    it is refused, and nothing is changed."""
