"""The live socket, random frames through the real ASGI application: a reply or an error frame,
never a crash or a closed socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from hypothesis import event, given
from hypothesis import strategies as st

from annihilation.asgi import application
from bursts.models import Wave
from core.access import operator_ensure
from tests.factories import make_chain
from tests.fuzz.conftest import FUZZ

pytestmark = pytest.mark.django_db(transaction=True)

ACTIONS = ["wave_cancel", "reaching_answer", "drift_ground", "drift_reject", "drift_note",
           "change_approve", "change_reject", "mutation_approve", "mutation_reject", "nope"]  # fmt: skip
KEYS = ["wave_id", "reaching_id", "drift_id", "change_id", "mutation_id", "text", "reason",
        "comment"]  # fmt: skip
PAGES = ["dashboard", "quantum", "wave", "focus", "tether", "grounding", "nope", ""]
TOPICS = ["quanta", "burst:events", "tether:reaching", "tether:drifts", "agent:1_s0_coder",
          "secrets", ""]  # fmt: skip
PROBE = "{"  # not JSON: its error frame marks the end of the replies to the frame before it
PROBE_REPLY = {"type": "error", "field": "frame", "error": "not valid JSON"}

leaves = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False),
    st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=0, max_value=5),
    st.text(max_size=20), st.sampled_from(["a\x00b", "\ud800", "x" * 20_000, "", " "]),
)  # fmt: skip
values = st.recursive(
    leaves, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=6
)  # fmt: skip


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` three times in four, any value otherwise."""
    return st.integers(0, 3).flatmap(lambda n: values if n == 0 else good)


ids = st.integers(min_value=1, max_value=3)
actions = st.fixed_dictionaries(
    {"action": mostly(st.sampled_from(ACTIONS))},
    optional={key: mostly(ids if key.endswith("_id") else st.text(max_size=10)) for key in KEYS},
)
subscriptions = st.fixed_dictionaries(
    {"subscribe": mostly(st.lists(st.sampled_from(TOPICS[:5]), min_size=1, max_size=3))},
    optional={
        "after": mostly(st.integers(min_value=-1, max_value=3)),
        "page": mostly(st.sampled_from(PAGES)),
        "params": mostly(st.dictionaries(st.sampled_from(["quantum_id", "wave_id", "agent_run_id"]), values)),
    },
)  # fmt: skip
frames = st.one_of(
    actions.map(json.dumps),
    subscriptions.map(json.dumps),
    values.map(json.dumps),
    st.text(max_size=50),
    st.binary(max_size=20),
    st.sampled_from(["[" * 100_000, "1" * 5000, '{"subscribe": ["quanta"]' + " " * 70_000 + "}"]),
)


async def _replies_to(socket: WebsocketCommunicator, frame: str | bytes) -> list[dict[str, Any]]:
    # send_input, not send_to: an empty frame is a frame too.
    key = "bytes" if isinstance(frame, bytes) else "text"
    await socket.send_input({"type": "websocket.receive", key: frame})
    await socket.send_to(text_data=PROBE)
    replies: list[dict[str, Any]] = []
    while True:
        output = await socket.receive_output(timeout=5)
        assert output["type"] == "websocket.send", output  # not closed
        reply = json.loads(output["text"])
        if reply == PROBE_REPLY:
            return replies
        replies.append(reply)


async def _exchange(user: Any, sent: list[str | bytes]) -> list[dict[str, Any]]:
    socket = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"origin", b"http://localhost")]
    )
    socket.scope["user"] = user
    connected, _ = await socket.connect()
    assert connected
    replies: list[dict[str, Any]] = []
    for frame in sent:
        replies += await _replies_to(socket, frame)
    await socket.disconnect()
    return replies


@FUZZ
@given(sent=st.lists(frames, min_size=1, max_size=4))
def test_any_frame_gets_a_reply_or_an_error_frame_and_the_socket_stays(
    redis_client, sent: list[str | bytes]
) -> None:
    operator = User.objects.filter(username="op").first()
    if operator is None:  # once per test: hashing the password is slow
        operator = operator_ensure(username="op", password="pw")
        make_chain(2)
        Wave.objects.create()
    for reply in asyncio.run(_exchange(operator, sent)):
        if reply.get("type") == "error":
            assert reply["field"] and len(reply["error"]) < 500, reply
            assert "the server log" not in reply["error"], reply  # an action's own bug
            event(f"error frame: {reply['field'][:20]}")
        elif "action" in reply:
            event(f"action {'done' if reply['ok'] else 'refused'}")
        else:
            assert "event" in reply, reply
            event("event")
