"""A local fake of the Messages API speaking the real streaming format (tests, benchmarks).

The official SDK is pointed at it with `base_url`; each POST /v1/messages gets the next reply
from a list or a function of the request body. As in the real API, every SSE frame has an
`event:` line and a `data:` line, and message_start must carry usage.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class FakeReply:
    text: str = ""
    tool_uses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: str = ""  # an error type sent as `event: error` in the stream (overloaded_error)
    status: int = 200  # an HTTP error status returned before streaming (429, 529 ...)
    delay_s: float = 0.0
    raw: str = ""  # sent as is after message_start, ending the stream (a malformed one)
    cut: bool = False  # the connection closed before the whole answer was sent
    tokens_in: int = 11
    tokens_out: int = 7


ReplySource = list[FakeReply] | Callable[[dict[str, Any]], FakeReply]


class FakeAnthropic:
    def __init__(self, replies: ReplySource) -> None:
        self._replies = replies
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, names lower-cased
        self.base_url = ""

    def next_reply(self, body: dict[str, Any]) -> FakeReply:
        with self._lock:
            self.requests.append(body)
            if callable(self._replies):
                return self._replies(body)
            if not self._replies:
                return FakeReply(text="(fake server has no more replies)")
            return self._replies.pop(0)

    def frames(self, reply: FakeReply, model: str) -> Iterator[bytes]:
        def frame(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        msg_id = f"msg_fake_{next(self._ids)}"
        yield frame(
            "message_start",
            {
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": reply.tokens_in, "output_tokens": 1},
                }
            },
        )
        if reply.raw:
            yield reply.raw.encode()
            return
        if reply.error:
            yield (
                "event: error\ndata: "
                + json.dumps(
                    {"type": "error", "error": {"type": reply.error, "message": "Overloaded"}}
                )
                + "\n\n"
            ).encode()
            return
        index = 0
        if reply.text:
            yield frame(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            for start in range(0, len(reply.text), 16):
                chunk = reply.text[start : start + 16]
                yield frame(
                    "content_block_delta",
                    {"index": index, "delta": {"type": "text_delta", "text": chunk}},
                )
            yield frame("content_block_stop", {"index": index})
            index += 1
        for name, args in reply.tool_uses:
            tool_id = f"toolu_fake_{next(self._ids)}"
            yield frame(
                "content_block_start",
                {
                    "index": index,
                    "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
                },
            )
            yield frame(
                "content_block_delta",
                {
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)},
                },
            )
            yield frame("content_block_stop", {"index": index})
            index += 1
        stop = "tool_use" if reply.tool_uses else "end_turn"
        yield frame(
            "message_delta",
            {
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": reply.tokens_out},
            },
        )
        yield frame("message_stop", {})


def _handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = fake.next_reply(body)
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status != 200:
                payload = json.dumps(
                    {
                        "type": "error",
                        "error": {"type": reply.error or "overloaded_error", "message": "busy"},
                    }
                ).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            data = b"".join(fake.frames(reply, str(body.get("model", "fake"))))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if reply.cut:
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            self.wfile.write(data)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A hundred agents connect at once. socketserver's backlog of 5 overflowed under load, and a
    # dropped connection attempt is retried after a second: one agent a second late.
    request_queue_size = 1024


@contextmanager
def fake_anthropic_server(replies: ReplySource) -> Iterator[FakeAnthropic]:
    """Serve on a free loopback port; `fake.base_url` is what the SDK needs."""
    fake = FakeAnthropic(replies)
    server = _Server(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
