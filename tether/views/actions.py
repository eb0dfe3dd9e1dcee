"""The Tether's websocket actions: what its pages' buttons send over the socket instead of a
form post (the consumer has checked user_can_operate). Each is one service call; a domain error
becomes ActionRefused, whose message the page shows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from core.live import ActionRefused, action_id, action_text, ws_action
from quanta.errors import QuantaError
from tether.errors import TetherError
from tether.models import Drift
from tether.services import (
    change_approve,
    change_reject,
    drift_ground,
    drift_note,
    drift_reject,
    mutation_approve,
    mutation_reject,
    reaching_answer,
)
from tether.views.changes import change_message
from tether.views.reachings import answer_message

T = TypeVar("T")


def _refusing(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (TetherError, QuantaError) as exc:
        raise ActionRefused(str(exc)) from None


@ws_action("reaching_answer")
def reaching_answer_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    reaching_id, text = action_id(message, "reaching_id"), action_text(message, "text")
    result = _refusing(
        lambda: reaching_answer(reaching_id=reaching_id, text=text, by=user.get_username())
    )
    return {
        "reaching_id": reaching_id,
        "kind": result.kind,
        "drift_id": result.drift_id,
        "correction_id": result.correction_id,
        "message": answer_message(result)[1],
    }


def _drift_reply(drift: Drift) -> dict[str, Any]:
    return {"drift_id": drift.pk, "status": drift.status, "correction_id": drift.correction_id}


@ws_action("drift_ground")
def drift_ground_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, comment = action_id(message, "drift_id"), action_text(message, "comment")
    return _drift_reply(
        _refusing(lambda: drift_ground(drift_id=drift_id, comment=comment, by=user.get_username()))
    )


@ws_action("drift_reject")
def drift_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, reason = action_id(message, "drift_id"), action_text(message, "reason")
    return _drift_reply(
        _refusing(lambda: drift_reject(drift_id=drift_id, reason=reason, by=user.get_username()))
    )


@ws_action("drift_note")
def drift_note_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, text = action_id(message, "drift_id"), action_text(message, "text")
    return _drift_reply(
        _refusing(lambda: drift_note(drift_id=drift_id, text=text, by=user.get_username()))
    )


@ws_action("change_approve")
def change_approve_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    change_id = action_id(message, "change_id")
    review = _refusing(lambda: change_approve(change_id=change_id, by=user.get_username()))
    return {"change_id": review.pk, "status": review.status, "message": change_message(review)[1]}


@ws_action("change_reject")
def change_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    change_id, reason = action_id(message, "change_id"), action_text(message, "reason")
    review = _refusing(
        lambda: change_reject(change_id=change_id, reason=reason, by=user.get_username())
    )
    return {"change_id": review.pk, "status": review.status}


@ws_action("mutation_approve")
def mutation_approve_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    mutation_id = action_id(message, "mutation_id")
    m = _refusing(lambda: mutation_approve(mutation_id=mutation_id, by=user.get_username()))
    return {"mutation_id": m.pk, "status": m.status, "version": m.resulting_version}


@ws_action("mutation_reject")
def mutation_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    mutation_id, reason = action_id(message, "mutation_id"), action_text(message, "reason")
    m = _refusing(
        lambda: mutation_reject(mutation_id=mutation_id, reason=reason, by=user.get_username())
    )
    return {"mutation_id": m.pk, "status": m.status}
