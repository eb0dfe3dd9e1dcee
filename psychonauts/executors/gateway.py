"""The model gateway: every model call of a CLI agent goes through the worker, never straight
out of the sandbox.

One gateway per CLI agent run, an HTTP server on a unix socket that is bind-mounted into the
sandbox (the sandbox has no network). It holds the real API key (the CLI inside only ever sees a
dummy), forwards `POST /v1/messages` (Anthropic's Messages API, `api="anthropic"`) or
`POST /v1/responses` (OpenAI's Responses API, `api="openai"`) to the real endpoint, streams the answer back as it comes,
reads the usage out of it and writes each response's cost (our price table,
`psychonauts.runtime.budget`) into the usage ledger, the run's counters and the registered
recorders. Before each call it enforces the model allow-list and the budgets (the quantum run's,
the wave's, the registered gates): a refused call gets HTTP 400 `invalid_request_error`, which
the CLIs do not retry (a 429 or 529 they retry for minutes), and the refusal is kept for the
run's error.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from bursts.models import AgentRun
from psychonauts.errors import PsychonautError, SlotTimeout, SuspendRun
from psychonauts.models import Usage
from psychonauts.routing.endpoints import settings_endpoint
from psychonauts.routing.ratelimits import (
    endpoint_call_succeeded,
    endpoint_limit,
    endpoint_rate_limited,
    rate_limit_suspensions,
    retry_after_s,
)
from psychonauts.routing.semaphore import slot_held, slots_in_use
from psychonauts.runtime.budget import (
    CallSpend,
    Spend,
    WaveBudget,
    budget_check,
    cost_usd,
    spend_recorded,
)
from psychonauts.runtime.checkpoint import CallUsage, usage_record

logger = logging.getLogger(__name__)

# Headers passed on to the real endpoint; everything else (the dummy key) stays behind.
_FORWARDED = ("content-type", "anthropic-version", "anthropic-beta", "accept", "openai-beta")
# The metered path of each API, as the CLI inside asks for it.
_PATHS = {"anthropic": "/v1/messages", "openai": "/v1/responses"}
# How often the server's loop looks for its shutdown: the run's end waits up to this long.
_POLL_S = 0.02
_UPSTREAM_TIMEOUT_S = 600.0  # a streamed answer may take minutes; no byte for this long ends it
# What the sandbox is told the key is.
DUMMY_KEY = "sk-ant-gateway-dummy"


@dataclass
class Metered:
    """What the gateway saw: calls forwarded and refused, tokens and cost."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal(0)
    refusals: list[str] = field(default_factory=list)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    gateway: Gateway


class Gateway:
    """The gateway of one agent run (see the module's docstring). A context manager: the socket
    exists while it is open."""

    def __init__(
        self,
        run: AgentRun,
        *,
        provider: str,
        allowed_models: frozenset[str],
        wave: WaveBudget | None,
        upstream: str = "",
        api_key: str = "",
        api: str = "anthropic",
    ) -> None:
        self.run = run
        self.provider = provider
        self.allowed_models = allowed_models
        self.wave = wave
        self.api = api
        self.path = _PATHS[api]
        if api == "openai":
            # The worker's OpenAI settings; the base URL holds its /v1.
            self.upstream = (
                upstream or os.environ.get("OPENAI_BASE_URL", "") or "https://api.openai.com/v1"
            )
            self.api_key = (
                api_key
                or getattr(settings, "OPENAI_API_KEY", "")
                or os.environ.get("OPENAI_API_KEY", "")
            )
        else:
            self.upstream = (
                upstream or os.environ.get("ANTHROPIC_BASE_URL", "") or "https://api.anthropic.com"
            )
            self.api_key = (
                api_key or settings.ANTHROPIC_API_KEY or os.environ.get("ANTHROPIC_API_KEY", "")
            )
        self.metered = Metered()
        # A spend gate's hold (SuspendRun's reason), or a long rate limit's: the run waits
        # rather than ends; a rate limit's for `hold_wait_s`, then it is resumed.
        self.hold = ""
        self.hold_wait_s = 0.0
        self.on_hold: Callable[[], None] | None = None  # told of a hold (the runner stops the CLI)
        self._lock = threading.Lock()
        self.folder = Path(tempfile.mkdtemp(prefix="agw-"))  # short: a socket path < 108 bytes
        self.socket = self.folder / "api.sock"
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Gateway:
        server = _Server(str(self.socket), _Handler)
        server.gateway = self
        # The sandbox's user (the quantum's uid) connects: the socket is the only thing here.
        self.folder.chmod(0o755)
        self.socket.chmod(0o777)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_S},
            name=f"gateway-{self.run.pk}",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def refusal(self) -> str:
        return self.metered.refusals[-1] if self.metered.refusals else ""

    # the checks ---------------------------------------------------------------------------
    def check(self, body: dict[str, Any], size: int) -> str:
        """Why the call may not be made ("" when it may)."""
        model = str(body.get("model", ""))
        if model not in self.allowed_models:
            return (
                f"model {model!r} is not allowed for this agent "
                f"(allowed: {', '.join(sorted(self.allowed_models))})"
            )
        try:
            budget_check(
                self.run, spend=self.spent(), wave=self.wave, model=model,
                estimate_tokens_in=size // 4,
            )  # fmt: skip
        except SuspendRun as exc:  # a gate holds the run: it waits, as our loop's would
            with self._lock:
                self.hold = str(exc)
            if self.on_hold is not None:
                self.on_hold()
            return str(exc)
        except PsychonautError as exc:  # BudgetExceeded
            return str(exc)
        return ""

    def spent(self) -> Spend:
        run = self.run
        usage = Usage.objects.all()
        mine = (
            usage.filter(quantum_run_id=run.quantum_run_id)
            if run.quantum_run_id
            else usage.filter(agent_run_id=run.pk)
        )
        total = mine.aggregate(s=Sum("cost_usd"))["s"] or Decimal(0)
        wave_total = None
        if self.wave is not None and self.wave.limit_usd is not None:
            wave_total = usage.filter(wave_id=self.wave.wave_id).aggregate(s=Sum("cost_usd"))[
                "s"
            ] or Decimal(0)
        return Spend(total, wave_total)

    def record(self, model: str, usage: _Usage) -> None:
        """One response's usage in the ledger and the run's counters, then the recorders."""
        run = self.run
        cost = cost_usd(
            model, usage.tokens_in, usage.tokens_out, cache_read=usage.cache_read,
            cache_write=usage.cache_write, cache_write_long=usage.cache_write_long,
        )  # fmt: skip
        usage_record(
            CallUsage(
                agent_run_id=run.pk, quantum_run_id=run.quantum_run_id,
                wave_id=self.wave.wave_id if self.wave is not None else None,
                provider=self.provider, model=model, phase=AgentRun.objects.get(pk=run.pk).phase,
                tokens_in=usage.tokens_in, tokens_out=usage.tokens_out,
                cache_read=usage.cache_read, cache_write=usage.cache_write,
                cache_write_long=usage.cache_write_long, cost_usd=cost, now=timezone.now(),
            )
        )  # fmt: skip
        with self._lock:
            self.metered.calls += 1
            self.metered.tokens_in += usage.tokens_in
            self.metered.tokens_out += usage.tokens_out
            self.metered.cost_usd += cost or Decimal(0)
        spend_recorded(
            CallSpend(
                agent_run_id=run.pk,
                quantum_id=run.quantum_id,
                labels=tuple(run.quantum.labels),
                provider=self.provider,
                model=model,
                tokens_in=usage.tokens_in,
                tokens_out=usage.tokens_out,
                usd=cost or Decimal(0),
                cache_read=usage.cache_read,
                cache_write=usage.cache_write + usage.cache_write_long,
                priced=cost is not None,
            )
        )

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.metered.refusals.append(reason)

    def wait_out(self, wait_s: float, endpoint: str) -> None:
        """The upstream refused a call for load and asked to wait longer than a worker waits
        (ENDPOINTS_RETRY_AFTER_MAX_S): the CLI is stopped and the run waits, holding no worker,
        until the wait is over (RateLimitWait), as our own loop's would. A run suspended for
        rate limits ENDPOINTS_RATE_LIMIT_TRIES times already ends instead."""
        if rate_limit_suspensions(self.run.pk) > settings.ENDPOINTS_RATE_LIMIT_TRIES:
            self.refuse(
                f"endpoint {endpoint} asked to wait {wait_s:.0f}s, and the run waited out its "
                f"rate limit {settings.ENDPOINTS_RATE_LIMIT_TRIES} times already"
            )
        else:
            with self._lock:
                self.hold = (
                    f"rate-limited by endpoint {endpoint}: it asked to wait {wait_s:.0f}s; "
                    "the run resumes then, holding no worker meanwhile"
                )
                self.hold_wait_s = wait_s
        if self.on_hold is not None:
            self.on_hold()


class _Usage:
    """Tokens read from a streamed (SSE) or whole JSON answer as it passes."""

    def __init__(self) -> None:
        self.tokens_in = 0  # read from no cache and written to none, as the API counts them
        self.tokens_out = 0
        self.cache_read = 0
        self.cache_write = 0  # five-minute writes
        self.cache_write_long = 0  # one-hour writes
        self._pending = b""

    def usage(self, usage: dict[str, Any] | None, *, start: bool) -> None:
        if not usage:
            return
        if start or "input_tokens" in usage:
            self.tokens_in = int(usage.get("input_tokens") or 0) or self.tokens_in
            self.cache_read = int(usage.get("cache_read_input_tokens") or 0) or self.cache_read
            written = int(usage.get("cache_creation_input_tokens") or 0)
            if written:
                split = usage.get("cache_creation")
                long = split.get("ephemeral_1h_input_tokens") if isinstance(split, dict) else 0
                self.cache_write_long = min(written, int(long or 0))
                self.cache_write = written - self.cache_write_long
        if "output_tokens" in usage:
            self.tokens_out = int(usage.get("output_tokens") or 0)

    def responses(self, usage: dict[str, Any] | None) -> None:
        """The Responses API's usage: its input tokens include the cached ones."""
        if not usage:
            return
        details = usage.get("input_tokens_details")
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        self.cache_read = cached
        self.tokens_in = max(0, int(usage.get("input_tokens") or 0) - cached)
        self.tokens_out = int(usage.get("output_tokens") or 0)

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            try:
                data = json.loads(line[5:])
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if data.get("type") == "message_start":
                self.usage((data.get("message") or {}).get("usage"), start=True)
            elif data.get("type") == "message_delta":
                self.usage(data.get("usage"), start=False)
            elif data.get("type") in ("response.completed", "response.incomplete"):
                self.responses((data.get("response") or {}).get("usage"))

    def whole(self, body: bytes) -> None:
        try:
            data = json.loads(body)
        except ValueError:
            return
        if isinstance(data, dict) and data.get("object") == "response":
            self.responses(data.get("usage"))
        elif isinstance(data, dict):
            self.usage(data.get("usage"), start=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # the answer ends when the connection closes: streams pass as is
    retry_after_s = 0.0  # what the upstream's last answer asked to wait

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:  # a unix socket has no client address
        return "sandbox"

    def _error(self, status: int, kind: str, message: str) -> None:
        # Both APIs' error shapes: Anthropic's `type` and `error`, OpenAI's `error` with `code`.
        payload = json.dumps(
            {"type": "error", "error": {"type": kind, "code": kind, "message": message}}
        )
        data = payload.encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._error(
            404,
            "not_found_error",
            f"the gateway serves POST {self.server.gateway.path}, not {self.path}",
        )

    def do_POST(self) -> None:
        gateway = self.server.gateway
        try:
            self._post(gateway)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            connection.close()  # this thread's database connection, if it opened one

    def _post(self, gateway: Gateway) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        path = urlsplit(self.path).path
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._error(400, "invalid_request_error", "the request body is not JSON")
            return
        if not isinstance(body, dict):
            self._error(400, "invalid_request_error", "the request body is not a JSON object")
            return
        metered = path.rstrip("/") == gateway.path
        if metered or path.startswith(gateway.path + "/"):
            reason = gateway.check(body, len(raw))
            if reason:
                gateway.refuse(reason)
                # Not 429/529: the CLIs would retry those for minutes.
                self._error(400, "invalid_request_error", f"refused by the gateway: {reason}")
                return
        else:
            self._error(404, "not_found_error", f"the gateway does not forward {path}")
            return
        # The upstream's slots and rate limits are those of the runs that call it directly
        # (psychonauts.routing.ratelimits): a 429 or 529 lowers its concurrency for every caller. The
        # CLI waits out the retry-after itself; the slot is given back meanwhile.
        endpoint = settings_endpoint("anthropic", base_url=gateway.upstream)
        assert endpoint is not None
        holder = f"{gateway.run.pk}:{os.getpid()}:{threading.get_ident()}"
        try:
            with slot_held(
                holder,
                limit=endpoint_limit(endpoint.name, endpoint.max_concurrency),
                wait_s=settings.ENDPOINTS_SLOT_WAIT_S,
                key=endpoint.slots_key,
            ):
                status = self._forward(gateway, path, raw, body, metered=metered)
        except SlotTimeout:
            self._error(529, "overloaded_error", f"every slot of {endpoint.name} stayed busy")
            return
        if status in (429, 529):
            in_flight = slots_in_use(key=endpoint.slots_key) + 1
            endpoint_rate_limited(endpoint.name, endpoint.max_concurrency, in_flight=in_flight)
            if self.retry_after_s > settings.ENDPOINTS_RETRY_AFTER_MAX_S:
                gateway.wait_out(self.retry_after_s, endpoint.name)
        elif status < 400:
            endpoint_call_succeeded(endpoint.name, endpoint.max_concurrency)

    def _forward(
        self, gateway: Gateway, path: str, raw: bytes, body: dict[str, Any], *, metered: bool
    ) -> int:
        """Send the request on to the upstream and stream its answer back; returns its status
        (502 when it could not be reached)."""
        target = urlsplit(gateway.upstream)
        kind = (
            http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        )
        upstream = kind(target.netloc, timeout=_UPSTREAM_TIMEOUT_S)
        headers = {k: v for k, v in self.headers.items() if k.lower() in _FORWARDED}
        if gateway.api == "openai":
            headers["authorization"] = f"Bearer {gateway.api_key}"
            path = path.removeprefix("/v1")  # the upstream's base URL holds it
        else:
            headers["x-api-key"] = gateway.api_key
        query = urlsplit(self.path).query
        try:
            upstream.request(
                "POST",
                target.path.rstrip("/") + path + (f"?{query}" if query else ""),
                body=raw,
                headers=headers,
            )
            response = upstream.getresponse()
        except OSError as exc:
            self._error(502, "api_error", f"the gateway could not reach the model endpoint: {exc}")
            return 502
        self.retry_after_s = retry_after_s(response.headers) or 0.0
        self.send_response(response.status)
        for key in ("content-type", "request-id", "retry-after"):
            value = response.getheader(key)
            if value:
                self.send_header(key, value)
        self.end_headers()
        usage = _Usage()
        streamed = "text/event-stream" in (response.getheader("content-type") or "")
        whole: list[bytes] = []
        try:
            while chunk := response.read1(65536):
                if streamed:
                    usage.feed(chunk)
                else:
                    whole.append(chunk)
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            upstream.close()
            if not streamed:
                usage.whole(b"".join(whole))
            if metered and (usage.tokens_in or usage.tokens_out or usage.cache_read):
                gateway.record(str(body.get("model", "")), usage)
        return int(response.status)
