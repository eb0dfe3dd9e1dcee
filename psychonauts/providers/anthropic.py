"""`anthropic`: the Messages API through the official SDK, streamed, with our own retry policy.

The SDK's standard environment applies (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL), so the provider
can be pointed at any compatible endpoint, including `psychonauts.providers.fake_server`.
The SDK's own retries are off: ours log, back off exponentially with jitter, and end with one
clear error naming the last failure.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any

import anthropic
from django.conf import settings

from psychonauts.errors import ProviderError
from psychonauts.providers.base import (
    ContentBlock,
    OnText,
    ProviderRequest,
    ProviderResponse,
)

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


_clients: dict[tuple[str, str], anthropic.Anthropic] = {}
_clients_lock = threading.Lock()


def shared_client() -> anthropic.Anthropic:
    """One client (one connection pool) per process and endpoint, shared by all agent threads.

    Building a client loads TLS certificates (tens of ms of CPU); a hundred agents each making
    their own would spend more CPU on that than on their turns. httpx clients are thread-safe.
    Reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL from the environment.
    """
    key = (os.environ.get("ANTHROPIC_BASE_URL", ""), os.environ.get("ANTHROPIC_API_KEY", ""))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = anthropic.Anthropic(max_retries=0)
            _clients[key] = client
        return client


def is_retryable(exc: Exception) -> bool:
    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return True
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code in _RETRY_STATUS or _error_type(exc) in _RETRY_TYPES
    return False


class AnthropicProvider:
    name = "anthropic"
    uses_llm = True

    def __init__(self, client: anthropic.Anthropic | None = None) -> None:
        self._client = client

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
            except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
                last = exc
                if not is_retryable(exc) or attempt == attempts:
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
        raise ProviderError(
            f"anthropic: {kind or type(last).__name__}"
            + (f" (HTTP {status})" if status else "")
            + f" after {attempt} attempt{'s' if attempt > 1 else ''}: {last}"
        ) from last

    def _stream_once(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": request.messages,
        }
        if request.tools:
            kwargs["tools"] = request.tools
        with self.client.messages.stream(**kwargs) as stream:
            for event in stream:
                if event.type == "text":
                    on_text(event.text)
            final = stream.get_final_message()
        content: list[ContentBlock] = []
        for block in final.content:
            if block.type == "text":
                content.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                args = block.input if isinstance(block.input, dict) else {}
                content.append(
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": args}
                )
        return ProviderResponse(
            content=content,
            stop_reason=final.stop_reason or "end_turn",
            tokens_in=final.usage.input_tokens,
            tokens_out=final.usage.output_tokens,
            model=final.model or request.model,
        )
