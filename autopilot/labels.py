"""The labels the autopilot puts on the quanta it files, and what they say.

Every quantum the autopilot files carries `autopilot` (the scope of the waves it starts) and
`autopilot:<state>`, the hub state its spend counts under; a goal's quanta also carry
`goal:<id>`. Work without these labels is the operator's own.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopilot.models import OPERATOR_SCOPE, HubState

AUTOPILOT = "autopilot"
_STATE_PREFIX = "autopilot:"
_GOAL_PREFIX = "goal:"


def state_label(state: str) -> str:
    return f"{_STATE_PREFIX}{state}"


def goal_label(goal_id: int) -> str:
    return f"{_GOAL_PREFIX}{goal_id}"


def filed_labels(state: str, *more: str) -> list[str]:
    """The labels of a quantum the autopilot files in `state` (then `more`, without repeats)."""
    labels = [AUTOPILOT, state_label(state)]
    labels.extend(label for label in more if label not in labels)
    return labels


def scope_of(labels: Sequence[str]) -> str:
    """The hub state a quantum's spend counts under, or `operator`."""
    for label in labels:
        if label.startswith(_STATE_PREFIX):
            state = label[len(_STATE_PREFIX) :]
            if state in HubState.values:
                return state
    return OPERATOR_SCOPE


def goal_of(labels: Sequence[str]) -> int | None:
    """The goal a quantum belongs to, from its `goal:<id>` label."""
    for label in labels:
        if label.startswith(_GOAL_PREFIX) and label[len(_GOAL_PREFIX) :].isdigit():
            return int(label[len(_GOAL_PREFIX) :])
    return None
