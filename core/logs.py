"""Structured logs: every record carries the ids of what it is about.

`log_context` holds the ids known for the work in hand: a request's id (RequestIdMiddleware), a
Celery task's id and the wave, quantum, run or agent ids among its arguments (the task signals
below). `ContextFilter` copies them onto each record a handler sees, unless the call passed its
own in `extra=`. `JsonFormatter` writes one JSON object per record (LOG_FORMAT=json), with every
`extra` field, redacted; `TextFormatter` a readable line with the ids at its end.
"""

from __future__ import annotations

import inspect
import logging
import logging.config
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import MappingProxyType
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from celery.signals import setup_logging, task_postrun, task_prerun
from django.http import HttpRequest, HttpResponseBase
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from core.redaction import redact_data

# The ids a record may carry, in the order a text line shows them.
IDS = (
    "request_id",
    "task_id",
    "wave_id",
    "burst_id",
    "quantum_id",
    "quantum_run_id",
    "agent_run_id",
    "agent_id",
    "delivery_id",
)
_ARG_IDS = frozenset(IDS) - {"request_id", "task_id"}

log_context: ContextVar[Mapping[str, object]] = ContextVar(
    "log_context", default=MappingProxyType({})
)

# A request id a client (or a proxy) sends is kept only when it is short and plain.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
REQUEST_ID_HEADER = "X-Request-ID"


@contextmanager
def log_ids(**ids: object) -> Iterator[None]:
    """Within the block, records carry these ids too (None values are left out)."""
    token = _push({k: v for k, v in ids.items() if v is not None})
    try:
        yield
    finally:
        log_context.reset(token)


def _push(ids: Mapping[str, object]) -> Token[Mapping[str, object]]:
    return log_context.set({**log_context.get(), **ids})


class ContextFilter(logging.Filter):
    """Puts the context's ids on the record (an id passed in `extra=` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in log_context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(_JsonFormatter):
    """One JSON object per line: time, level, logger, message, the ids and every `extra` field
    (redacted: a field may hold what the message would not), and the traceback."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", True)
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        super().__init__("%(levelname)s %(name)s %(message)s", **kwargs)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        message = log_data.get("message")
        redacted: dict[str, Any] = redact_data(
            {k: v for k, v in log_data.items() if k != "message"}
        )
        return {"message": message, **redacted} if message is not None else redacted


class TextFormatter(logging.Formatter):
    """`time level logger: message [wave_id=3 quantum_id=7]` — the ids the record carries."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        ids = " ".join(f"{k}={getattr(record, k)}" for k in IDS if hasattr(record, k))
        return f"{line} [{ids}]" if ids else line


# --- requests -----------------------------------------------------------------------------------


def plain_request_id(given: str) -> str:
    """`given` when it is a plain request id, else a new one."""
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex


def request_id_for(request: HttpRequest) -> str:
    return plain_request_id(request.headers.get(REQUEST_ID_HEADER, ""))


class RequestIdMiddleware:
    """Gives each request an id (the client's X-Request-ID when plain, else a new one): on every
    record logged while it is handled, and on the response's X-Request-ID."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        request_id = request_id_for(request)
        token = _push({"request_id": request_id})
        try:
            response: HttpResponseBase = self.get_response(request)
        finally:
            log_context.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        request_id = request_id_for(request)
        token = _push({"request_id": request_id})
        try:
            get: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
            response = await get(request)
        finally:
            log_context.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        return response


# --- Celery tasks -------------------------------------------------------------------------------

_TOKENS: dict[str, Token[Mapping[str, object]]] = {}
_PARAMETERS: dict[str, tuple[str, ...]] = {}


def _parameters(task: Any) -> tuple[str, ...]:
    """The task's parameter names (read once per task)."""
    name = getattr(task, "name", "") or ""
    found = _PARAMETERS.get(name)
    if found is None:
        try:
            found = tuple(inspect.signature(task.run).parameters)
        except (TypeError, ValueError):
            found = ()
        _PARAMETERS[name] = found
    return found


def task_ids(task: Any, args: Any, kwargs: Any) -> dict[str, object]:
    """The ids among a task's arguments (by parameter name), and the task's own id."""
    ids: dict[str, object] = {}
    for name, value in zip(_parameters(task), args or (), strict=False):
        if name in _ARG_IDS and isinstance(value, int | str):
            ids[name] = value
    for name, value in (kwargs or {}).items():
        if name in _ARG_IDS and isinstance(value, int | str):
            ids[name] = value
    return ids


@task_prerun.connect
def _task_started(task_id: str = "", task: Any = None, args: Any = None, kwargs: Any = None,
                  **_: Any) -> None:  # fmt: skip
    _TOKENS[task_id] = _push({"task_id": task_id, **task_ids(task, args, kwargs)})


@task_postrun.connect
def _task_finished(task_id: str = "", **_: Any) -> None:
    token = _TOKENS.pop(task_id, None)
    if token is not None:
        try:
            log_context.reset(token)
        except ValueError:  # set in another context (an eager task run elsewhere)
            log_context.set(MappingProxyType({}))


@setup_logging.connect
def _keep_django_logging(**_: Any) -> None:
    """A Celery worker or beat keeps the LOGGING of the settings (JSON or text, redacted, with
    ids) instead of installing its own handlers."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
