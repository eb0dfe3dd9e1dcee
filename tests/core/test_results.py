"""The result backend (core.celery.ResultBackend): a worker that sends a fan-out stage's chord
keeps nothing of its header results."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chord, group
from celery._state import (  # type: ignore[attr-defined]
    _set_task_join_will_block,
    task_join_will_block,
)

from bursts.tasks import stage_agent, stage_done
from core.celery import ResultBackend, app


@pytest.fixture
def in_a_worker() -> Iterator[None]:
    """As in a worker's task: joining a result would block (the worker sets this at start)."""
    before = task_join_will_block()
    _set_task_join_will_block(True)
    yield
    _set_task_join_will_block(before)


def test_the_app_uses_it() -> None:
    assert type(app.backend) is ResultBackend


def test_a_chord_sent_from_a_worker_keeps_none_of_its_header_results(in_a_worker: None) -> None:
    queue = f"test-chord-{uuid.uuid4().hex}"
    backend: Any = app.backend
    consumer = backend.result_consumer
    try:
        for _ in range(3):
            run = {"quantum_run_id": 1, "stage_index": 1}
            header = [
                stage_agent.signature(
                    kwargs={**run, "position": p, "final": False},
                    immutable=True,
                    options={"queue": queue},
                )
                for p in range(3)
            ]
            body = stage_done.signature(
                kwargs=run, immutable=True, options={"ignore_result": True, "queue": queue}
            )
            sent: Any = chord(group(header), body).apply_async()
            ids = [r.id for r in sent.parent.results]
            del sent
            gc.collect()
            held = [i for mapping in backend._pending_results for i in ids if i in mapping]
            assert held == []
            assert not {backend.get_key_for_task(i) for i in ids} & consumer.subscribed_to
    finally:
        with app.connection_for_write() as conn, conn.SimpleQueue(queue) as q:
            q.clear()
