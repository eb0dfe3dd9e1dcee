"""Server-rendered fragments for live pages: one small template per (page, topic, event type).

A page tells the websocket which page it is (`page`, `params`). For each event the consumer
renders the first template that exists of

    live/<page>/<topic kind>/<event type>.html    e.g. live/focus/agent/text.html
    live/<page>/<topic kind>/_any.html            e.g. live/dashboard/burst/_any.html

(`topic kind` is the topic up to its colon: agent, burst, quanta, tether, reflection). Every
top-level element of the result says where it goes with `data-swap`:
`replace` (the element with the same id), `append:<container id>` or `prepend:<container id>`;
static/live.js applies them. A page that wants more than the event (fresh counters, say)
registers a context function with `live_page`, which runs once per event for that page.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Max
from django.template import TemplateDoesNotExist
from django.template.loader import select_template
from django.utils import timezone

from core.events import EventMessage
from core.hooks import Hook
from core.models import Event
from core.safetext import text_problem

LiveContext = Callable[[EventMessage, Mapping[str, str]], dict[str, Any]]


@dataclass(frozen=True)
class LivePage:
    """A page that renders fragments, with the extra context they need (None: the event)."""

    name: str
    context: LiveContext | None = None


LIVE_PAGES: Hook[LivePage] = Hook("core.live_pages", key=lambda page: page.name)


class LivePageError(Exception):
    """A page's parameters are unusable (unknown id): the page gets events without fragments."""


def live_page(name: str) -> Callable[[LiveContext], LiveContext]:
    """Register the extra context of a live page's fragments."""

    def register(fn: LiveContext) -> LiveContext:
        LIVE_PAGES.register(LivePage(name, fn))
        return fn

    return register


def live_page_known(name: str) -> bool:
    return LIVE_PAGES.get(name) is not None


def events_last_id() -> int:
    """The newest event id: a page rendered now catches up from here when its socket connects."""
    return Event.objects.aggregate(m=Max("id"))["m"] or 0


# How long an event's transaction may stay open after its id was taken (a later id can commit
# first): a page that must lose nothing catches up from the last event older than this.
SETTLED_S = 10.0


def events_settled_id(*, settled_s: float = SETTLED_S) -> int:
    """A catch-up point that loses nothing, taken before a page reads what it shows: every event
    above it is replayed, including one whose transaction had its id before a newer one
    committed and was still open while the page was read. What the page shows already comes
    again with the same element id and replaces itself (static/live.js)."""
    cutoff = timezone.now() - timedelta(seconds=settled_s)
    return (
        Event.objects.filter(created_at__lte=cutoff)
        .order_by("-id")
        .values_list("id", flat=True)[:1]
        .first()
        or 0
    )


def fragment_render(
    event: EventMessage, *, page: str, params: Mapping[str, str], can_operate: bool
) -> str:
    """The HTML fragments of `event` for `page`, or "" when the page shows nothing for it."""
    found = LIVE_PAGES.get(page)
    if found is None:
        return ""
    kind = event["topic"].split(":", 1)[0]
    try:
        template = select_template(
            [f"live/{page}/{kind}/{event['type']}.html", f"live/{page}/{kind}/_any.html"]
        )
    except TemplateDoesNotExist:
        return ""
    context_fn = found.context
    context: dict[str, Any] = {"event": event, "payload": event["payload"], "params": params}
    context["can_operate"] = can_operate
    if context_fn is not None:
        try:
            context.update(context_fn(event, params))
        except LivePageError:
            return ""
    return str(template.render(context)).strip()


# --- websocket actions ------------------------------------------------------------------------

WsAction = Callable[[Any, Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class LiveAction:
    """An operator action a page may send over its socket, by name."""

    name: str
    run: WsAction


LIVE_ACTIONS: Hook[LiveAction] = Hook("core.live_actions", key=lambda action: action.name)


class ActionRefused(Exception):
    """An action that cannot be done as asked (stale object, bad argument); message for humans.

    `field` names the argument that was wrong, when one was.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(message)


ID_MAX = 2**63 - 1  # ids are bigints
ACTION_TEXT_MAX = 10_000  # characters of an answer, a reason or a note (the forms' limit)


def action_id(message: Mapping[str, Any], key: str) -> int:
    """The id an action names under `key`; ActionRefused naming it otherwise."""
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ActionRefused(f"{key} must be an integer", field=key)
    if not 0 < value <= ID_MAX:
        raise ActionRefused(f"{key} must be an id (1 or more, below 2**63)", field=key)
    return value


def action_text(message: Mapping[str, Any], key: str) -> str:
    """Text an action takes under `key` ("" when absent); ActionRefused naming it otherwise."""
    value = message.get(key, "")
    if not isinstance(value, str):
        raise ActionRefused(f"{key} must be text", field=key)
    if len(value) > ACTION_TEXT_MAX:
        raise ActionRefused(f"{key} is longer than {ACTION_TEXT_MAX:,} characters", field=key)
    problem = text_problem(value)
    if problem is not None:
        raise ActionRefused(f"{key} {problem}", field=key)
    return value


def ws_action(name: str) -> Callable[[WsAction], WsAction]:
    """Register an operator action a page may send over its socket: fn(user, message) -> reply.

    The consumer checks `user_can_operate` before calling any of them.
    """

    def register(fn: WsAction) -> WsAction:
        LIVE_ACTIONS.register(LiveAction(name, fn))
        return fn

    return register


def ws_action_get(name: str) -> WsAction | None:
    found = LIVE_ACTIONS.get(name)
    return found.run if found is not None else None


def live_attrs(
    topics: list[str], page: str, *, after: int | None = None, **params: Any
) -> dict[str, Any]:
    """What base.html puts on <body> for static/live.js: topics, page, params, catch-up point
    (`after`: one the page took before reading what it shows; else the newest event now)."""
    return {
        "live_topics": topics,
        "live_topics_json": json.dumps(topics),
        "live_page": page,
        "live_params_json": json.dumps({k: str(v) for k, v in params.items()}),
        "live_after": events_last_id() if after is None else after,
    }
