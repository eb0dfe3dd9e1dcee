"""`anthropic`: the Messages API through the official SDK, streamed, with our own retry policy.

The SDK's standard environment applies (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL): the base URL
can point at any compatible endpoint. The SDK's own retries are off: ours log, back off
exponentially with jitter, and end with one clear error naming the last failure.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import random
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import httpx2
from django.conf import settings

from psychonauts.errors import ProviderError
from psychonauts.routing.providers.base import (
    ContentBlock,
    OnText,
    ProviderRequest,
    ProviderResponse,
    expect_int,
    expect_str,
)
from psychonauts.routing.providers.caching import cached_body

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_RETRY_TYPES = frozenset({"overloaded_error", "rate_limit_error", "api_error"})


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("type", ""))
    return ""


_clients: dict[tuple[str, str, int], anthropic.Anthropic] = {}
_clients_lock = threading.Lock()
# Clients (connection pools) per process and endpoint; each thread keeps to one of them.
CLIENT_SHARDS = 16
_thread = threading.local()
_shards = itertools.count()


def shared_client() -> anthropic.Anthropic:
    """A client of the process's few per endpoint (CLIENT_SHARDS), shared by agent threads.

    Loading the TLS certificates is dear in CPU: the process does it once, and its clients
    share the context (a threads worker makes all 16 as it starts: `shared_clients_warm`). A
    client per agent would spend more CPU than the agents' turns. One client for all of them is
    no better: its pool looks at every connection it holds, probing each idle one's socket,
    whenever a request starts or ends, so a hundred threads on one pool made a hundred system
    calls per request (each handing the GIL around). Threads take a shard in turn and keep it;
    httpx clients are thread-safe. Reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL from the
    environment.
    """
    shard = getattr(_thread, "shard", None)
    if shard is None:
        shard = _thread.shard = next(_shards) % CLIENT_SHARDS
    return _shard_client(shard)


def shared_clients_warm() -> int:
    """Make every shard's client for the endpoint of the environment now, with the TLS context
    and the HTTP stack's modules they load, rather than inside the first agents'
    turns; returns how many were made. Nothing when ANTHROPIC_API_KEY is not set (the SDK
    refuses to make a client without one; the runs' own calls will say so)."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return 0
    with _clients_lock:
        before = len(_clients)
    for shard in range(CLIENT_SHARDS):
        _shard_client(shard)
    with _clients_lock:
        return len(_clients) - before


def _shard_client(shard: int) -> anthropic.Anthropic:
    key = (
        os.environ.get("ANTHROPIC_BASE_URL", ""),
        os.environ.get("ANTHROPIC_API_KEY", ""),
        shard,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            http_client = anthropic.DefaultHttpxClient(verify=_tls_context())
            client = anthropic.Anthropic(max_retries=0, http_client=http_client)
            _clients[key] = client
        return client


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context the SDK would make for each client (system certificates, or SSL_CERT_FILE
    and SSL_CERT_DIR), made once per process."""
    return httpx2.create_ssl_context()


# A connection lost or timed out, before the answer began (the SDK's error) or while it streamed
# (the HTTP client's own): always worth another attempt.
_CONNECTION_LOST = (anthropic.APIConnectionError, httpx2.TransportError)


def is_retryable(exc: Exception) -> bool:
    if isinstance(exc, _CONNECTION_LOST):
        return True
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code in _RETRY_STATUS or _error_type(exc) in _RETRY_TYPES
    return False


def is_rate_limited(exc: Exception) -> bool:
    """The API refused for load: HTTP 429 or 529, or an overloaded or rate limit error."""
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code in (429, 529) or _error_type(exc) in (
            "overloaded_error",
            "rate_limit_error",
        )
    return False


class AnthropicProvider:
    name = "anthropic"
    uses_llm = True

    def __init__(
        self, client: anthropic.Anthropic | None = None, *, rate_limits_to_caller: bool = False
    ) -> None:
        self._client = client
        # A 429 or 529 ends the call at once (ProviderError from the SDK's error) rather than
        # being retried here: the caller (an endpoint's slots) waits it out without its slot.
        self.rate_limits_to_caller = rate_limits_to_caller

    @property
    def client(self) -> anthropic.Anthropic:
        if self._client is None:
            self._client = shared_client()
        return self._client

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        attempts = settings.PSYCHONAUTS_PROVIDER_RETRIES
        last: Exception | None = None
        for attempt in range(1, attempts + 1):
            try:
                return self._stream_once(request, on_text)
            except (anthropic.APIStatusError, *_CONNECTION_LOST) as exc:
                last = exc
                if not is_retryable(exc) or attempt == attempts:
                    break
                if self.rate_limits_to_caller and is_rate_limited(exc):
                    break
                delay = settings.PSYCHONAUTS_RETRY_BASE_S * 2 ** (attempt - 1)
                delay *= 0.5 + random.random() / 2
                logger.warning(
                    "anthropic call failed (%s), retry %d/%d in %.2fs",
                    type(exc).__name__,
                    attempt,
                    attempts - 1,
                    delay,
                    extra={"agent_run_id": request.run.agent_run_id},
                )
                time.sleep(delay)
        assert last is not None
        kind = _error_type(last) if isinstance(last, anthropic.APIStatusError) else ""
        status = getattr(last, "status_code", None)
        # A refusal for load handed to the caller: the caller counts its attempts.
        handed = self.rate_limits_to_caller and is_rate_limited(last)
        raise ProviderError(
            f"anthropic: {kind or type(last).__name__}"
            + (f" (HTTP {status})" if status else "")
            + ("" if handed else f" after {attempt} attempt{'s' if attempt > 1 else ''}")
            + f": {last}"
        ) from last

    def _stream_once(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        """One streamed call: the body serialized once and posted as is, the server-sent events
        read as JSON.

        `messages.create(stream=True)` took twice the CPU per call (bench/agents_concurrency.py:
        a 62 KB conversation, a 2,000-character answer), which a worker running a hundred agents
        pays under one GIL: it deep-copies the request (every message and tool schema) before
        encoding it, and builds a typed model of every event. The SDK's client still sends the
        request (its authentication, headers, timeouts and status errors) and decodes the event
        stream; the OpenTelemetry span `messages.create` would add is not made.
        """
        body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens}
        if settings.PSYCHONAUTS_PROMPT_CACHE:
            body.update(
                cached_body(
                    system=request.system,
                    tools=request.tools,
                    messages=request.messages,
                    long_ttl=request.long_cache,
                )
            )
        else:
            body.update(system=request.system, messages=request.messages)
            if request.tools:
                body["tools"] = request.tools
        body["stream"] = True
        stream = _Stream(request.model)
        response = self.client.post(
            "/v1/messages",
            cast_to=httpx2.Response,
            content=json.dumps(body).encode(),
            options={"headers": {"content-type": "application/json"}},
            stream=True,
        )
        try:
            for sse in anthropic.Stream.raw_events(response):
                request.deadline_check()
                if sse.event == "error":
                    error = _json(sse.data)
                    raise anthropic.APIStatusError(
                        f"error event: {sse.data[:500]}", response=response, body=error
                    )
                if sse.data and sse.event != "ping":
                    stream.take(_json(sse.data), on_text)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProviderError(f"anthropic: malformed stream event ({exc!r})") from exc
        finally:
            response.close()
        return stream.response()


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProviderError(f"anthropic: a stream event is not JSON: {data[:200]!r}") from exc


class _Stream:
    """A message being streamed, assembled from the raw events (only what the loop uses)."""

    def __init__(self, model: str) -> None:
        self.blocks: dict[int, _Block] = {}
        self.model, self.stop_reason, self.tokens_in, self.tokens_out = model, "end_turn", 0, 0
        self.cache_read = self.cache_write = self.cache_write_long = 0

    def take(self, event: dict[str, Any], on_text: OnText) -> None:
        """One event; KeyError, TypeError or AttributeError when it is not shaped as documented."""
        kind = event["type"]
        if kind == "content_block_delta":
            block, delta = self.blocks.get(event["index"]), event["delta"]
            if block is None:
                return
            if delta["type"] == "text_delta":
                text = expect_str(delta["text"])
                block.parts.append(text)
                on_text(text)
            elif delta["type"] == "input_json_delta":
                block.parts.append(expect_str(delta["partial_json"]))
        elif kind == "content_block_start":
            start = event["content_block"]
            if start["type"] == "text":
                self.blocks[expect_int(event["index"])] = _Block(
                    "text", parts=[expect_str(start["text"])]
                )
            elif start["type"] == "tool_use":
                self.blocks[expect_int(event["index"])] = _Block(
                    "tool_use", expect_str(start["id"]), expect_str(start["name"])
                )
        elif kind == "message_start":
            message = event["message"]
            self.model = expect_str(message.get("model") or self.model)
            usage = message["usage"]
            self.tokens_in = expect_int(usage["input_tokens"])
            self.tokens_out = expect_int(usage["output_tokens"])
            self.cache_read = expect_int(usage.get("cache_read_input_tokens") or 0)
            written = expect_int(usage.get("cache_creation_input_tokens") or 0)
            # The split by TTL, when the API gives it; otherwise all of it for five minutes.
            split = usage.get("cache_creation") or {}
            self.cache_write_long = min(
                written, expect_int(split.get("ephemeral_1h_input_tokens") or 0)
            )
            self.cache_write = written - self.cache_write_long
        elif kind == "message_delta":
            self.stop_reason = expect_str(event["delta"].get("stop_reason") or self.stop_reason)
            self.tokens_out = expect_int(event["usage"]["output_tokens"])

    def response(self) -> ProviderResponse:
        blocks = self.blocks
        # The API refuses an empty text block when the conversation is sent back.
        content = [
            blocks[index].content()
            for index in sorted(blocks)
            if blocks[index].type == "tool_use" or any(blocks[index].parts)
        ]
        return ProviderResponse(
            content=content,
            stop_reason=self.stop_reason,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            model=self.model,
            cache_read=self.cache_read,
            cache_write=self.cache_write,
            cache_write_long=self.cache_write_long,
        )


@dataclass
class _Block:
    """A content block being streamed: text pieces, or a tool call's JSON pieces."""

    type: Literal["text", "tool_use"]
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)

    def content(self) -> ContentBlock:
        if self.type == "text":
            return {"type": "text", "text": "".join(self.parts)}
        try:
            args = json.loads("".join(self.parts) or "{}")
        except json.JSONDecodeError:
            args = None
        # Not an object: the tool's schema check tells the model what it got wrong.
        return {
            "type": "tool_use",
            "id": self.id,
            "name": self.name,
            "input": args if isinstance(args, dict) else {},
        }
