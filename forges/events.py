"""The forges app's events: their names (past tense), on the Tether's grounding topic, where the
pull requests of change reviews are followed."""

from __future__ import annotations

from enum import StrEnum

from tether.events import CHANGES_TOPIC

TOPIC = CHANGES_TOPIC


class ForgeEventType(StrEnum):
    PULL_REQUEST_PUBLISHED = "pull_request_published"  # opened or updated on the forge
    PULL_REQUEST_FAILED = "pull_request_failed"  # the forge refused it
    PULL_REQUEST_MERGED = "pull_request_merged"  # merged on the forge
    PULL_REQUEST_CLOSED = "pull_request_closed"  # closed on the forge, unmerged
