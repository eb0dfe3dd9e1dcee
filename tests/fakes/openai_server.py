"""A local fake of an OpenAI-compatible server (chat completions, streamed; models list).

The official SDK is pointed at it with `base_url` (ending in /v1); each POST
/v1/chat/completions gets the next reply from a list or a function of the request body. Its
streams are valid but awkward, as real local servers' are: text in small pieces, a tool call's
arguments split into fragments of a few characters (its id and name only in the first), the
usage in a last chunk without choices (when asked with stream_options.include_usage), keep-alive
comments between chunks. It also counts the requests in flight at once (`max_in_flight`).
"""

from __future__ import annotations

import itertools
import json
import sys
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
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: int = 200  # an HTTP error status returned before streaming (429, 500 ...)
    retry_after: str = ""  # the Retry-After header of an error status
    delay_s: float = 0.0  # before the answer begins
    hang_s: float = 0.0  # after the first chunk: a server that stops sending
    drip_s: float = 0.0  # between chunks: a model that keeps answering, slowly
    raw: str = ""  # sent as is after the first chunk, then the connection closes (garbage)
    cut: bool = False  # the connection closes half way through the stream
    fragment: int = 3  # the size of each piece of a tool call's arguments
    finish: str = ""  # the finish reason; by default "tool_calls" or "stop"
    tokens_in: int = 11
    tokens_out: int = 7
    cached_tokens: int = 0  # of tokens_in, read from the server's prefix cache (when > 0)
    error: dict[str, Any] | None = None  # the JSON body of an error status, as the server sends it
    arguments_cut: int = 0  # the last call's arguments stop after this many characters


ReplySource = list[FakeReply] | Callable[[dict[str, Any]], FakeReply]


class FakeOpenAI:
    def __init__(self, replies: ReplySource, *, models: list[str] | None = None) -> None:
        self._replies = replies
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.models = models if models is not None else ["fake-model"]
        self.models_status = 200  # what GET /v1/models answers (500: a broken server)
        self.models_raw = ""  # sent as GET /v1/models's body instead of the list (garbage)
        self.in_flight = 0
        self.max_in_flight = 0
        self.gave_up = 0  # answers the client closed before their end
        self.base_url = ""

    def next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> FakeReply:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if callable(self._replies):
                return self._replies(body)
            if not self._replies:
                return FakeReply(text="(fake server has no more replies)")
            return self._replies.pop(0)

    def entered(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def left(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def completion(self, reply: FakeReply, model: str) -> dict[str, Any]:
        """The answer as one chat.completion (a request without `stream`)."""
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.text},
                    "finish_reason": reply.finish or "stop",
                }
            ],
            "usage": {
                "prompt_tokens": reply.tokens_in,
                "completion_tokens": reply.tokens_out,
                "total_tokens": reply.tokens_in + reply.tokens_out,
            },
        }

    def chunks(self, reply: FakeReply, model: str, usage: bool) -> Iterator[bytes]:
        chunk_id = f"chatcmpl-fake-{next(self._ids)}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""})
        for start in range(0, len(reply.text), 5):
            yield chunk({"content": reply.text[start : start + 5]})
            if start == 0:
                yield b": keep-alive\n\n"
        for index, (name, args) in enumerate(reply.tool_calls):
            arguments = json.dumps(args)
            if reply.arguments_cut and index == len(reply.tool_calls) - 1:
                arguments = arguments[: reply.arguments_cut]
            call_id = f"call_fake_{next(self._ids)}"
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
            for start in range(0, len(arguments), reply.fragment):
                piece = arguments[start : start + reply.fragment]
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
        yield chunk({}, finish)
        if usage:
            data = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": reply.tokens_in,
                    "completion_tokens": reply.tokens_out,
                    "total_tokens": reply.tokens_in + reply.tokens_out,
                    **(
                        {"prompt_tokens_details": {"cached_tokens": reply.cached_tokens}}
                        if reply.cached_tokens
                        else {}
                    ),
                },
            }
            yield f"data: {json.dumps(data)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if not self.path.endswith("/models"):
                self._json(404, {"error": {"message": "not found"}}, {})
                return
            if fake.models_raw:
                data = fake.models_raw.encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if fake.models_status != 200:
                self._json(fake.models_status, {"error": {"message": "broken"}}, {})
                return
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 1, "owned_by": "fake"}
                        for m in fake.models
                    ],
                },
                {},
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            reply = fake.next_reply(body, {k.lower(): v for k, v in self.headers.items()})
            fake.entered()
            try:
                self._answer(reply, body)
            except (BrokenPipeError, ConnectionResetError):
                with fake._lock:  # the client gave up (a timeout): nothing more to send
                    fake.gave_up += 1
            finally:
                fake.left()

        def _answer(self, reply: FakeReply, body: dict[str, Any]) -> None:
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status != 200:
                headers = {"retry-after": reply.retry_after} if reply.retry_after else {}
                self._json(
                    reply.status,
                    reply.error
                    or {"error": {"message": f"fake status {reply.status}", "type": "fake"}},
                    headers,
                )
                return
            if not body.get("stream"):
                if reply.raw:
                    data = reply.raw.encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if reply.hang_s:
                    time.sleep(reply.hang_s)
                self._json(200, fake.completion(reply, str(body.get("model", "fake"))), {})
                return
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = list(fake.chunks(reply, str(body.get("model", "fake")), usage))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def send(data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            send(chunks[0])
            if reply.hang_s:
                time.sleep(reply.hang_s)
            if reply.raw:
                send(reply.raw.encode())
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
                return
            if reply.cut:
                for data in chunks[1 : len(chunks) // 2]:
                    send(data)
                self.close_connection = True  # no last chunk: the body ends unfinished
                return
            for data in chunks[1:]:
                time.sleep(reply.drip_s)
                send(data)
            self.wfile.write(b"0\r\n\r\n")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its kept-alive connection is not an error worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def fake_openai_server(
    replies: ReplySource, *, models: list[str] | None = None
) -> Iterator[FakeOpenAI]:
    """Serve on a free loopback port; `fake.base_url` (ending in /v1) is what the SDK needs."""
    fake = FakeOpenAI(replies, models=models)
    server = _Server(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
