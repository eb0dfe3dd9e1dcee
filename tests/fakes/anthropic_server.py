"""A local fake of the Messages API speaking the real streaming format (tests, benchmarks).

The official SDK is pointed at it with `base_url`; each POST /v1/messages gets the next reply
from a list or a function of the request body. As in the real API, every SSE frame has an
`event:` line and a `data:` line, and message_start must carry usage.

Given a `PromptCache`, the fake caches prompts by the API's rules and reports the usage the API
would: see `PromptCache`.
"""

from __future__ import annotations

import hashlib
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
    retry_after: str = ""  # the retry-after header of an error status
    delay_s: float = 0.0
    drip_s: float = 0.0  # between events: a model that keeps answering, slowly
    raw: str = ""  # sent as is after message_start, ending the stream (a malformed one)
    cut: bool = False  # the connection closed before the whole answer was sent
    tokens_in: int = 11
    tokens_out: int = 7


ReplySource = list[FakeReply] | Callable[[dict[str, Any]], FakeReply]


class CacheRefused(Exception):
    """A request the API refuses for its cache marks (HTTP 400, invalid_request_error)."""


class PromptCache:
    """The Messages API's prompt caching rules, as documented:

    - a request is a sequence of blocks: the tools, then the system blocks, then each message's
      content blocks (a string content is one block); an entry caches the prefix up to and
      including a block marked with `cache_control`, for one model;
    - at most 4 marks a request; marks with `"ttl": "1h"` before any with the default 5 minutes;
    - a prefix shorter than the model's minimum cacheable length (`min_tokens`; 1024 tokens, 2048
      for the Haiku models when not given) is not cached;
    - for each mark, the longest cached prefix is looked for at that block and at most 19 blocks
      before it (20 in all), among the prefixes earlier requests marked;
    - an entry lives for its TTL after it was last written or read;
    - usage: `cache_read_input_tokens` the prefix read, `cache_creation_input_tokens` what was
      written after it up to the last cacheable mark (split by TTL in `cache_creation`),
      `input_tokens` the rest.

    A block counts `len(json)/4` tokens (the same content, the same count; no tokenizer).
    `clock` is the time in seconds; `advance` moves the fake's own time forward.
    """

    LOOKBACK = 20
    TTL_S = {"5m": 300.0, "1h": 3600.0}

    def __init__(self, *, min_tokens: int | None = None) -> None:
        self.min_tokens = min_tokens
        self._entries: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (expiry, ttl)
        self._lock = threading.Lock()
        self._offset = 0.0

    def clock(self) -> float:
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += seconds

    def _minimum(self, model: str) -> int:
        if self.min_tokens is not None:
            return self.min_tokens
        return 2048 if "haiku" in model else 1024

    @staticmethod
    def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"tool": t} for t in body.get("tools") or []]
        system = body.get("system")
        if isinstance(system, str) and system:
            blocks.append({"system": {"type": "text", "text": system}})
        elif isinstance(system, list):
            blocks.extend({"system": b} for b in system)
        for message in body.get("messages") or []:
            content = message["content"]
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            for n, block in enumerate(content):
                blocks.append({"role": message["role"] if n == 0 else "", "block": block})
        return blocks

    @staticmethod
    def _mark(block: dict[str, Any]) -> dict[str, Any] | None:
        inner = next(iter(block.values())) if "block" not in block else block["block"]
        mark = inner.get("cache_control") if isinstance(inner, dict) else None
        return mark if isinstance(mark, dict) else None

    @staticmethod
    def _canonical(block: dict[str, Any]) -> str:
        def strip(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: strip(v) for k, v in value.items() if k != "cache_control"}
            if isinstance(value, list):
                return [strip(v) for v in value]
            return value

        return json.dumps(strip(block), sort_keys=True)

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request's usage, caching what it marks; CacheRefused for marks the API refuses."""
        model = str(body.get("model", ""))
        blocks = self._blocks(body)
        hashes: list[str] = []
        cumulative: list[int] = []
        digest, total = hashlib.sha256(model.encode()), 0
        for block in blocks:
            text = self._canonical(block)
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += max(1, len(text) // 4)
            cumulative.append(total)
        marks = [(i, m) for i, b in enumerate(blocks) if (m := self._mark(b)) is not None]
        if len(marks) > 4:
            raise CacheRefused("A maximum of 4 blocks with cache_control may be provided.")
        ttls = [str(m.get("ttl", "5m")) for _, m in marks]
        if any(t not in self.TTL_S for t in ttls):
            raise CacheRefused("cache_control.ttl: Input should be '5m' or '1h'")
        if "1h" in ttls and "5m" in ttls[: len(ttls) - ttls[::-1].index("1h")]:
            raise CacheRefused("cache_control blocks with a 1h ttl must come before 5m ones")
        minimum = self._minimum(model)
        with self._lock:
            now = self.clock()
            for key in [k for k, (expiry, _) in self._entries.items() if expiry <= now]:
                del self._entries[key]
            read = -1
            for index, _ in marks:
                for j in range(index, max(-1, index - self.LOOKBACK), -1):
                    entry = self._entries.get((model, hashes[j]))
                    if entry is not None:
                        self._entries[(model, hashes[j])] = (now + entry[1], entry[1])
                        read = max(read, j)
                        break
            written = {"5m": 0, "1h": 0}
            boundary = read
            for (index, _), ttl in zip(marks, ttls, strict=True):
                if index <= boundary or cumulative[index] < minimum:
                    continue
                before = cumulative[boundary] if boundary >= 0 else 0
                written[ttl] += cumulative[index] - before
                self._entries[(model, hashes[index])] = (now + self.TTL_S[ttl], self.TTL_S[ttl])
                boundary = index
        cached = cumulative[boundary] if boundary >= 0 else 0
        return {
            "input_tokens": total - cached,
            "cache_read_input_tokens": cumulative[read] if read >= 0 else 0,
            "cache_creation_input_tokens": written["5m"] + written["1h"],
            "cache_creation": {
                "ephemeral_5m_input_tokens": written["5m"],
                "ephemeral_1h_input_tokens": written["1h"],
            },
        }


class FakeAnthropic:
    def __init__(self, replies: ReplySource, cache: PromptCache | None = None) -> None:
        self.cache = cache
        self.usages: list[dict[str, Any]] = []  # with a cache: each request's, in order
        self._replies = replies
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers, names lower-cased
        self.gave_up = 0  # answers the client closed before their end
        self.base_url = ""

    def next_reply(self, body: dict[str, Any]) -> FakeReply:
        with self._lock:
            self.requests.append(body)
            if callable(self._replies):
                return self._replies(body)
            if not self._replies:
                return FakeReply(text="(fake server has no more replies)")
            return self._replies.pop(0)

    def frames(
        self, reply: FakeReply, model: str, usage: dict[str, Any] | None = None
    ) -> Iterator[bytes]:
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
                    "usage": {
                        **(usage or {"input_tokens": reply.tokens_in}),
                        "output_tokens": 1,
                    },
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
            usage = None
            if fake.cache is not None and reply.status == 200:
                try:
                    usage = fake.cache.usage(body)
                except CacheRefused as exc:
                    self._error(400, "invalid_request_error", str(exc))
                    return
                with fake._lock:
                    fake.usages.append(usage)
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
                if reply.retry_after:
                    self.send_header("retry-after", reply.retry_after)
                self.end_headers()
                self.wfile.write(payload)
                return
            frames = list(fake.frames(reply, str(body.get("model", "fake")), usage))
            data = b"".join(frames)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if reply.drip_s:
                try:
                    for frame in frames:
                        self.wfile.write(frame)
                        self.wfile.flush()
                        time.sleep(reply.drip_s)
                except (BrokenPipeError, ConnectionResetError):
                    with fake._lock:  # the client gave up before the end
                        fake.gave_up += 1
                    self.close_connection = True
                return
            if reply.cut:
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            payload = json.dumps(
                {"type": "error", "error": {"type": kind, "message": message}}
            ).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A hundred agents connect at once. socketserver's backlog of 5 overflowed under load, and a
    # dropped connection attempt is retried after a second: one agent a second late.
    request_queue_size = 1024


@contextmanager
def fake_anthropic_server(
    replies: ReplySource, *, cache: PromptCache | None = None
) -> Iterator[FakeAnthropic]:
    """Serve on a free loopback port; `fake.base_url` is what the SDK needs."""
    fake = FakeAnthropic(replies, cache)
    server = _Server(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
