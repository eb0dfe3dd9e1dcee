"""A local fake of OpenAI's Responses API (`POST /v1/responses`, streamed), the only API the Codex
CLI speaks; tests and benchmarks point Codex at it through the gateway.

Each request gets the next reply from a list or a function of the request body. A reply is text
(an assistant `message` item) and function calls (`function_call` items, arguments as a JSON
string; `mcp__<server>__<tool>` is called as the tool of the namespace `mcp__<server>`), sent as the real API streams them: `response.created`, `response.output_item.added`,
`response.output_text.delta`, `response.output_item.done` per item, then `response.completed`
with the usage (input tokens include the cached ones). An error status is returned before any
stream; `failed` ends the stream with `response.failed`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class FakeReply:
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # A freeform (custom) tool call: its name and raw input (Codex's apply_patch).
    custom: tuple[str, str] | None = None
    status: int = 200
    failed: str = ""  # a message: the stream ends with response.failed
    tokens_in: int = 11
    tokens_out: int = 7
    cached_tokens: int = 0


ReplySource = list[FakeReply] | Callable[[dict[str, Any]], FakeReply]


class FakeResponses:
    def __init__(self, replies: ReplySource) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.base_url = ""

    def next_reply(self, body: dict[str, Any]) -> FakeReply:
        if callable(self.replies):
            return self.replies(body)
        with self._lock:
            index = sum(1 for r in self.requests if r is not body and r.get("input")) - 1
        if index < len(self.replies):
            return self.replies[max(0, index)]
        return FakeReply(text="(script finished)")

    def frames(self, reply: FakeReply, model: str) -> Iterator[bytes]:
        def frame(data: dict[str, Any]) -> bytes:
            return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()

        number = next(self._ids)
        response_id = f"resp_fake_{number}"
        yield frame(
            {
                "type": "response.created",
                "response": {"id": response_id, "object": "response", "model": model},
            }
        )
        items: list[dict[str, Any]] = []
        if reply.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{number}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        for i, (name, arguments) in enumerate(reply.calls):
            call = {
                "type": "function_call",
                "id": f"fc_{number}_{i}",
                "call_id": f"call_fake_{number}_{i}",
                "name": name,
                "arguments": json.dumps(arguments),
                "status": "completed",
            }
            if "__" in name.removeprefix("mcp__"):
                # A tool of a namespace (an MCP server's, `mcp__<server>__<tool>`) is called by
                # its namespace and its own name.
                call["namespace"], call["name"] = name.rsplit("__", 1)
            items.append(call)
        if reply.custom is not None:
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{number}",
                    "call_id": f"call_fake_{number}_c",
                    "name": reply.custom[0],
                    "input": reply.custom[1],
                    "status": "completed",
                }
            )
        for index, item in enumerate(items):
            yield frame({"type": "response.output_item.added", "output_index": index, "item": item})
            if item["type"] == "message":
                yield frame(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "delta": reply.text,
                    }
                )
            yield frame({"type": "response.output_item.done", "output_index": index, "item": item})
        if reply.failed:
            yield frame(
                {
                    "type": "response.failed",
                    "response": {
                        "id": response_id,
                        "object": "response",
                        "status": "failed",
                        "error": {"code": "server_error", "message": reply.failed},
                    },
                }
            )
            return
        yield frame(
            {
                "type": "response.completed",
                "response": {
                    "id": response_id,
                    "object": "response",
                    "status": "completed",
                    "model": model,
                    "output": items,
                    "usage": {
                        "input_tokens": reply.tokens_in,
                        "input_tokens_details": {"cached_tokens": reply.cached_tokens},
                        "output_tokens": reply.tokens_out,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": reply.tokens_in + reply.tokens_out,
                    },
                },
            }
        )


def _handler(fake: FakeResponses) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [], "models": []})
                return
            self._json(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.loads(raw) if raw else {}
            with fake._lock:
                fake.requests.append(body)
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                fake.paths.append(self.path)
            if not self.path.split("?")[0].rstrip("/").endswith("/responses"):
                self._json(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})
                return
            reply = fake.next_reply(body)
            if reply.status != 200:
                self._json(
                    reply.status,
                    {"error": {"message": "fake error", "type": "server_error", "code": None}},
                )
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            for data in fake.frames(reply, str(body.get("model", ""))):
                self.wfile.write(data)
                self.wfile.flush()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-stream


@contextmanager
def fake_responses_server(replies: ReplySource) -> Iterator[FakeResponses]:
    fake = FakeResponses(replies)
    server = _Server(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
