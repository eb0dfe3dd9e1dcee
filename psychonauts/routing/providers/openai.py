"""`openai`: any OpenAI-compatible chat-completions endpoint (Ollama, vLLM, llama.cpp, a gateway)
through the official SDK, streamed.

Our conversation is Anthropic-shaped (`base.Message`: text, tool_use and tool_result blocks);
this module translates it to the chat-completions format (a system message, assistant
`tool_calls`, one `tool` message per result) and the streamed answer back. The SDK retries what
it retries (429 with its Retry-After, 5xx, a refused or timed-out connection) up to
PSYCHONAUTS_PROVIDER_RETRIES attempts in all; a stream cut after it began is retried here, in
the same budget. A stream that is not JSON or not shaped as documented is a ProviderError
naming what was wrong, not retried: the same answer would come back.

Without an endpoint from the registry (`psychonauts.routing.endpoints`), the SDK's standard environment
applies: OPENAI_BASE_URL and OPENAI_API_KEY.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from django.conf import settings

from psychonauts.errors import ContextOverflow, InfrastructureError, ProviderError
from psychonauts.routing.providers.base import (
    ContentBlock,
    Message,
    OnText,
    ProviderRequest,
    ProviderResponse,
    ToolSpec,
    expect_int,
    expect_str,
)

logger = logging.getLogger(__name__)

# Local servers rarely check the key, but the SDK refuses to start without one.
NO_KEY = "not-needed"

_clients: dict[tuple[str, str, float], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def client_for(*, base_url: str, api_key: str, timeout_s: float) -> openai.OpenAI:
    """The process's client (its connection pool) for one endpoint; httpx clients are
    thread-safe, so agent threads share it. `timeout_s` bounds the wait for each read: a
    server that stops sending mid-stream times out rather than hanging the agent."""
    key = (base_url, api_key, timeout_s)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = openai.OpenAI(
                base_url=base_url or None,
                api_key=api_key or NO_KEY,
                max_retries=max(0, settings.PSYCHONAUTS_PROVIDER_RETRIES - 1),
                timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            )
            _clients[key] = client
        return client


# A connection lost or timed out while the answer streamed (the SDK's error, or the HTTP
# client's own): worth another attempt.
_CONNECTION_LOST = (openai.APIConnectionError, httpx2.TransportError)


class StreamCut(Exception):
    """The stream ended before its finish reason (the server closed it half way)."""


class OpenAIProvider:
    name = "openai"
    uses_llm = True

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float | None = None,
        client: openai.OpenAI | None = None,
        text_tool_calls: bool = False,
    ) -> None:
        self._base_url = base_url
        self._text_tool_calls = text_tool_calls
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._client = client

    @property
    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = client_for(
                base_url=self._base_url
                if self._base_url is not None
                else os.environ.get("OPENAI_BASE_URL", ""),
                api_key=self._api_key
                if self._api_key is not None
                else os.environ.get("OPENAI_API_KEY", ""),
                timeout_s=self._timeout_s or float(settings.ENDPOINTS_TIMEOUT_S),
            )
        return self._client

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        attempts = settings.PSYCHONAUTS_PROVIDER_RETRIES
        attempt = 1
        while True:
            try:
                return self._stream_once(request, on_text)
            except (*_CONNECTION_LOST, StreamCut) as exc:
                # A request that never got its answer was retried by the SDK already; a stream
                # that broke after it began is retried here.
                if attempt >= attempts or not getattr(exc, "mid_stream", True):
                    raise InfrastructureError(
                        f"openai: {_describe(exc)} after {attempt} "
                        f"attempt{'s' if attempt > 1 else ''}"
                    ) from exc
                logger.warning(
                    "openai stream broke (%s), retry %d/%d",
                    type(exc).__name__,
                    attempt,
                    attempts - 1,
                    extra={"agent_run_id": request.run.agent_run_id},
                )
                attempt += 1
            except openai.APIStatusError as exc:
                message = _status_message(exc)
                if exc.status_code == 400 and _CONTEXT_OVERFLOW.search(message):
                    raise ContextOverflow(
                        f"openai: HTTP 400 from {request.model}: the request exceeds the "
                        f"model's context: {message}"
                    ) from exc
                # The server's own trouble (overloaded, down) is not the agent's doing.
                error = (
                    InfrastructureError
                    if exc.status_code in (429, 502, 503, 504)
                    else ProviderError
                )
                raise error(
                    f"openai: HTTP {exc.status_code} from {request.model}: {message}"
                ) from exc
            except openai.OpenAIError as exc:
                raise ProviderError(f"openai: {type(exc).__name__}: {exc}") from exc

    def _stream_once(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        """One streamed call through `with_streaming_response`: the SDK sends it (its
        authentication, retries, status errors), the server-sent events are read as JSON."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": to_openai_messages(request.system, request.messages),
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = to_openai_tools(request.tools)
        stream = _Stream(
            request.model,
            frozenset(t["name"] for t in request.tools) if self._text_tool_calls else None,
        )
        opened = self.client.chat.completions.with_streaming_response.create(**body)
        try:
            response = opened.__enter__()
        except _CONNECTION_LOST as exc:
            exc.mid_stream = False  # type: ignore[union-attr]
            raise
        try:
            for line in response.iter_lines():
                request.deadline_check()
                if not line.startswith("data:"):
                    continue  # event names, comments, keep-alives
                data = line[5:].strip()
                if data == "[DONE]":
                    stream.done = True
                    break
                try:
                    stream.take(_json(data), on_text)
                except (KeyError, TypeError, AttributeError, IndexError) as exc:
                    raise ProviderError(
                        f"openai: malformed stream chunk ({exc!r}): {data[:200]!r}"
                    ) from exc
        finally:
            opened.__exit__(None, None, None)
        return stream.response()


# How servers say a prompt is over the model's context: llama.cpp ("exceeds the available context
# size"), vLLM and OpenAI ("maximum context length", context_length_exceeded), Ollama.
_CONTEXT_OVERFLOW = re.compile(
    r"context (size|length|window)|context_length_exceeded|too many tokens|"
    r"exceeds? the (available|maximum) context",
    re.IGNORECASE,
)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (openai.APITimeoutError, httpx2.TimeoutException)):
        return "timed out waiting for the endpoint"
    if isinstance(exc, StreamCut):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:300]
    return str(exc)[:300]


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProviderError(f"openai: a stream chunk is not JSON: {data[:200]!r}") from exc


# --- our messages to theirs -----------------------------------------------------------------


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in tools
    ]


def _text_of(content: Any) -> str:
    """A tool result's or message's content as text (a string, or a list of text blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return str(content)


def to_openai_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation in the chat-completions format.

    A user message's tool results become `tool` messages right after the assistant message
    whose calls they answer (the format requires it), before any text the message also holds.
    """
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        texts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")]
        if message["role"] == "assistant":
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
                }
                for b in content
                if b.get("type") == "tool_use"
            ]
            entry: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
            continue
        for block in content:
            if block.get("type") == "tool_result":
                text = _text_of(block.get("content", ""))
                if block.get("is_error"):
                    text = f"error: {text}"
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


# --- their stream to our answer -------------------------------------------------------------

_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


@dataclass
class _Call:
    """A tool call being streamed: its id and name arrive first, its arguments in fragments."""

    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


def prompt_cached_tokens(usage: dict[str, Any]) -> int:
    """The prompt tokens the server read from its prefix cache: OpenAI's
    `usage.prompt_tokens_details.cached_tokens` (servers that cache automatically report it;
    the prompt's stable prefix, the system message, tools and earlier turns sent unchanged,
    is what they match)."""
    details = usage.get("prompt_tokens_details") or {}
    return expect_int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


class _Stream:
    def __init__(self, model: str, text_tool_calls: frozenset[str] | None = None) -> None:
        self.model = model
        # The tool names whose calls written as text are taken as calls (None: text is text).
        self.text_tool_calls = text_tool_calls
        self.served_by = ""
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.finish = ""
        self.done = False
        self.tokens_in = self.tokens_out = self.cached = 0

    def take(self, chunk: dict[str, Any], on_text: OnText) -> None:
        """One chunk; KeyError, TypeError, AttributeError or IndexError when it is not shaped
        as documented."""
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise ProviderError(f"openai: error in the stream: {str(message)[:300]}")
        self.served_by = expect_str(chunk.get("model") or self.served_by)
        usage = chunk.get("usage")
        if usage:
            self.tokens_in = expect_int(usage.get("prompt_tokens") or 0)
            self.tokens_out = expect_int(usage.get("completion_tokens") or 0)
            self.cached = prompt_cached_tokens(usage)
        for choice in chunk["choices"]:
            if expect_int(choice.get("index", 0)) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.text.append(expect_str(text))
                on_text(text)
            for fragment in delta.get("tool_calls") or ():
                call = self.calls.setdefault(
                    expect_int(fragment.get("index", len(self.calls))), _Call()
                )
                call.id = expect_str(fragment.get("id") or call.id)
                function = fragment.get("function") or {}
                call.name = call.name or expect_str(function.get("name") or "")
                arguments = function.get("arguments")
                if arguments:
                    call.parts.append(expect_str(arguments))
            if choice.get("finish_reason"):
                self.finish = expect_str(choice["finish_reason"])

    def response(self) -> ProviderResponse:
        if not self.finish:
            raise StreamCut(
                "the stream ended before its finish reason"
                + (" (no [DONE])" if not self.done else "")
            )
        content: list[ContentBlock] = []
        text = "".join(self.text)
        if text:
            content.append({"type": "text", "text": text})
        for n, index in enumerate(sorted(self.calls), start=1):
            call = self.calls[index]
            if not call.name:
                raise ProviderError(f"openai: malformed stream: tool call {index} has no name")
            try:
                args = json.loads("".join(call.parts) or "{}")
            except json.JSONDecodeError:
                args = None
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"call_{n}",
                    "name": call.name,
                    # Not an object: the tool's schema check tells the model what it got wrong.
                    "input": args if isinstance(args, dict) else {},
                }
            )
        if not self.calls and self.text_tool_calls is not None:
            content = text_tool_calls(content, self.text_tool_calls)
        calls = any(b["type"] == "tool_use" for b in content)
        # Some servers end a turn of tool calls with "stop": the calls decide. An answer cut at
        # its output limit stays "max_tokens" whatever it holds: its last call may be half
        # written, and the runtime runs none of them.
        if self.finish == "length":
            stop = "max_tokens"
        else:
            stop = "tool_use" if calls else _STOP_REASONS.get(self.finish, self.finish)
        return ProviderResponse(
            content=content,
            stop_reason=stop,
            # prompt_tokens counts the cached ones too: tokens_in is the rest.
            tokens_in=max(self.tokens_in - self.cached, 0),
            cache_read=min(self.cached, self.tokens_in),
            tokens_out=self.tokens_out,
            model=self.model,
            extra={"served_by": self.served_by} if self.served_by else {},
        )


# --- tool calls written as text ---------------------------------------------------------------

# A fenced block (```json or a bare ```) holding one JSON object, or a <tool_call> tag around one
# (Qwen's own chat template): how small models write a call they were asked to make as a tool
# call.
_FENCED = re.compile(
    r"```(?:json)?[ \t]*\n(?P<fenced>\{.*?\})[ \t]*\n?```|<tool_call>\s*(?P<tagged>\{.*?\})\s*</tool_call>",
    re.DOTALL,
)


def text_tool_calls(content: list[ContentBlock], tools: frozenset[str]) -> list[ContentBlock]:
    """An answer's text with its tool calls written as text taken out as tool_use blocks, for an
    endpoint marked to have them parsed (`Endpoint.text_tool_calls`).

    Strict: a block becomes a call only when it is a JSON object of exactly `name` (one of the
    request's tools) and `arguments` (an object, or a string holding one); any other block, and
    all of the text when one block is not such a call, stays text, so prose that shows JSON is
    never run. The text around the calls stays the answer's text."""
    text = "".join(b["text"] for b in content if b["type"] == "text")
    found = list(_FENCED.finditer(text))
    if not found:
        return content
    calls: list[ContentBlock] = []
    for n, match in enumerate(found, start=1):
        call = _text_call(match.group("fenced") or match.group("tagged"), tools)
        if call is None:
            return content
        name, arguments = call
        calls.append({"type": "tool_use", "id": f"text_call_{n}", "name": name, "input": arguments})
    rest = _FENCED.sub("", text).strip()
    return [*([{"type": "text", "text": rest}] if rest else []), *calls]  # type: ignore[list-item]


def _text_call(raw: str, tools: frozenset[str]) -> tuple[str, dict[str, Any]] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"name", "arguments"}:
        return None
    name, arguments = data["name"], data["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or name not in tools or not isinstance(arguments, dict):
        return None
    return name, arguments
