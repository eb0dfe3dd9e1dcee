"""Structured logs: JSON or text records carrying the request, task, wave, quantum and agent ids,
with secrets redacted."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import logging.config
from collections.abc import Iterator
from typing import Any

import pytest

from core.logs import ContextFilter, JsonFormatter, TextFormatter, log_ids, task_ids
from core.redaction import RedactingFilter

SECRET = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz"


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    """A logger whose handler is configured as LOGGING's console handler is."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_record_carries_the_context_ids_and_extra_fields(capture):
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    with log_ids(wave_id=3, quantum_id=7):
        with log_ids(agent_run_id=11, agent_id="11_s0_coder"):
            logger.info("agent %s started", "coder", extra={"stage": 0})
        logger.warning("wave step")
    logger.info("outside")
    inner, outer, bare = records(stream)
    assert inner["message"] == "agent coder started"
    assert inner["level"] == "INFO" and inner["logger"] == "tests.logs" and inner["timestamp"]
    assert (inner["wave_id"], inner["quantum_id"], inner["agent_run_id"]) == (3, 7, 11)
    assert inner["agent_id"] == "11_s0_coder" and inner["stage"] == 0
    assert outer["wave_id"] == 3 and "agent_run_id" not in outer
    assert "wave_id" not in bare


def test_an_id_passed_in_extra_wins_over_the_context(capture):
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    with log_ids(quantum_id=1):
        logger.info("x", extra={"quantum_id": 2})
    assert records(stream)[0]["quantum_id"] == 2


def test_secrets_are_redacted_from_the_message_the_extras_and_the_traceback(capture):
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    try:
        raise RuntimeError(f"provider refused key {SECRET}")
    except RuntimeError:
        logger.exception("call with %s failed", SECRET, extra={"header": f"x-api-key: {SECRET}"})
    text = stream.getvalue()
    assert "AbCdEfGhIjKlMnOpQrStUvWxYz" not in text
    (record,) = records(stream)
    assert "redacted" in record["message"] and "redacted" in record["header"]
    assert "RuntimeError" in record["exc_info"]


def test_a_text_record_is_readable_with_its_ids(capture):
    logger, stream, handler = capture
    handler.setFormatter(TextFormatter())
    with log_ids(wave_id=4, request_id="req-1"):
        logger.info("hello %s", SECRET)
    line = stream.getvalue().strip()
    assert " INFO tests.logs: hello sk-ant-…(redacted" in line
    assert line.endswith("[request_id=req-1 wave_id=4]")


def test_the_settings_choose_the_format(settings):
    assert settings.LOGGING["handlers"]["console"]["formatter"] in {"json", "text"}
    assert settings.LOGGING["handlers"]["console"]["filters"] == ["redact", "context"]
    config = {**settings.LOGGING, "handlers": {**settings.LOGGING["handlers"]}}
    stream = io.StringIO()
    config["handlers"]["console"] = {**config["handlers"]["console"], "formatter": "json",
                                     "stream": stream}  # fmt: skip
    root = logging.getLogger()
    saved = root.handlers[:]
    try:
        logging.config.dictConfig(config)
        logging.getLogger("hooks.x").warning("configured", extra={"wave_id": 9})
    finally:
        root.handlers = saved
        logging.config.dictConfig(settings.LOGGING)
    assert records(stream)[0]["wave_id"] == 9


def test_a_task_s_ids_come_from_its_arguments():
    from celery import shared_task

    @shared_task(name="tests.logs.sample")
    def sample(quantum_run_id: int, stage_index: int, wave_id: int | None = None) -> None: ...

    assert task_ids(sample, (5, 1), {"wave_id": 2}) == {"quantum_run_id": 5, "wave_id": 2}


@pytest.mark.django_db(transaction=True)
def test_a_request_carries_its_id_to_its_records_and_response(client, settings, capture):
    _logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    hooks_logger = logging.getLogger("hooks")
    hooks_logger.addHandler(handler)
    settings.HOOKS_GITHUB_SECRET = "request-id-test-secret"
    body = b'{"zen": "hi"}'
    signature = "sha256=" + hmac.new(b"request-id-test-secret", body, hashlib.sha256).hexdigest()
    try:
        response = client.post(
            "/hooks/github", body, content_type="application/json",
            headers={"X-Request-ID": "abc-123", "X-GitHub-Event": "ping",
                     "X-GitHub-Delivery": "req-id-ping", "X-Hub-Signature-256": signature},
        )  # fmt: skip
    finally:
        hooks_logger.removeHandler(handler)
    assert response.status_code == 202
    assert response["X-Request-ID"] == "abc-123"
    (record,) = [r for r in records(stream) if r["logger"] == "hooks.services.github"]
    assert record["request_id"] == "abc-123" and record["delivery_id"] == "req-id-ping"
    fresh = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert fresh["X-Request-ID"] != "bad id with spaces" and len(fresh["X-Request-ID"]) == 32
