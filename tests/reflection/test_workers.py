"""Reflection on real Celery workers: two workers sent the chain of the same burst at once make
one reflection run, each delta proposed once, the state a single chain leaves, and the second
start finds the stored run. (A real wave reflected on by a worker: test_pipeline.py,
test_a_real_wave_is_reflected_on_by_the_workers.)"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from bursts.models import AgentRun, Burst
from core.celery import app
from core.models import Event
from psychonauts.models import DiaryEntry, DiarySource
from reflection import pipeline
from reflection.models import PlaybookDelta, PlaybookRule, ReflectionRun
from reflection.tasks import reflection_chain
from tests.bursts.conftest import Worker, fast_settings, make_worker, step_log  # noqa: F401
from tests.polling import wait_for
from tests.reflection.test_pipeline import world  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STAGES = len(pipeline.STAGES)
DELTA_FIELDS = ("pk", "op", "text", "kind", "scope", "status", "reason", "rule_id", "decided_by",
                "roles", "evidence_agent_run_ids", "evidence_event_ids")  # fmt: skip
RULE_FIELDS = ("pk", "text", "kind", "scope", "maturity", "roles", "created_by",
               "evidence_agent_run_ids", "evidence_event_ids")  # fmt: skip


def node(worker: Worker) -> str:
    return f"{worker.name}@{os.uname().nodename}"


def consume(worker: Worker, queue: str) -> None:
    """The worker also takes tasks from `queue` (only it does): a chain sent there starts on it."""
    replies = app.control.add_consumer(queue, destination=[node(worker)], reply=True, timeout=5)
    assert replies, f"{worker.name} did not answer add_consumer"


def totals(workers: list[Worker]) -> dict[str, Counter[str]]:
    """How many tasks of each name each worker has run, by its node name."""
    stats = app.control.inspect(destination=[node(w) for w in workers], timeout=2).stats()
    return {name: Counter(stat["total"]) for name, stat in (stats or {}).items()}


def tasks_run(workers: list[Worker]) -> Counter[str]:
    """How many tasks of each name the workers have started, all together."""
    return sum(totals(workers).values(), Counter())


def idle(workers: list[Worker]) -> bool:
    active = app.control.inspect(destination=[node(w) for w in workers], timeout=2).active()
    return active is not None and len(active) == len(workers) and not any(active.values())


def outcome() -> dict[str, Any]:
    """What reflection left: its run, every delta (all of the run) and every rule, their ids
    included. The run's own id is left out: a start that lost the race for the burst's run
    may have drawn an id from the sequence first."""
    run = ReflectionRun.objects.get()
    assert not PlaybookDelta.objects.exclude(reflection_run=run).exists()
    return {
        "run": (run.burst_id, run.status, run.error, run.counts),
        "deltas": list(PlaybookDelta.objects.order_by("pk").values_list(*DELTA_FIELDS)),
        "rules": list(PlaybookRule.objects.order_by("pk").values_list(*RULE_FIELDS)),
        "diary": sorted(DiaryEntry.objects.values_list("agent_run_id", "kind", "text", "source")),
    }


def reflection_forget() -> None:
    """Reflection's rows gone and their ids restarted, the reflector's diary entries and
    reflection's events too: as before the burst was reflected on."""
    DiaryEntry.objects.filter(source=DiarySource.REFLECTOR).delete()
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE reflection_playbookdelta, reflection_playbookrule, "
            "reflection_reflectionrun RESTART IDENTITY CASCADE"
        )
    Event.objects.filter(topic__startswith="reflection:").delete()


def test_two_workers_sent_one_bursts_chain_at_once_reflect_on_it_once(
    burst: Burst,
    world: dict[str, AgentRun],  # noqa: F811
    make_worker: Callable[..., Worker],  # noqa: F811
) -> None:
    reflection_forget()  # ids from 1, as for the single chain below (earlier tests drew some)
    workers = [make_worker("ra", beat=False), make_worker("rb", beat=False)]
    consume(workers[0], f"reflection-a-{os.getpid()}")
    consume(workers[1], f"reflection-b-{os.getpid()}")

    # The two chains at once, each starting on its own worker.
    reflection_chain(burst.pk).apply_async(queue=f"reflection-a-{os.getpid()}")
    reflection_chain(burst.pk).apply_async(queue=f"reflection-b-{os.getpid()}")
    wait_for(
        lambda: tasks_run(workers)["reflection.stage"] == 2 * STAGES and idle(workers),
        timeout=30,
        what="both chains to run every stage",
    )
    by_worker = totals(workers)
    assert [by_worker[node(w)]["reflection.start"] for w in workers] == [
        1,
        1,
    ]  # one start on each worker
    run = ReflectionRun.objects.get(burst=burst)
    assert run.status == "completed", run.error
    assert ReflectionRun.objects.count() == 1
    # The second start found the stored run: it published nothing and carried no stage.
    started = Event.objects.filter(topic="reflection:started")
    assert [e.payload["reflection_run"] for e in started] == [run.pk]
    assert Event.objects.filter(topic="reflection:completed").count() == 1
    texts = list(PlaybookDelta.objects.filter(reflection_run=run).values_list("text", flat=True))
    assert len(texts) == len(set(texts)) == run.counts["proposed"]  # each proposed once
    again, cached = pipeline.reflect_burst(burst.pk)
    assert cached and again is not None and again.pk == run.pk
    raced = outcome()

    # The same burst reflected on by one chain alone leaves the same state.
    reflection_forget()
    reflection_chain(burst.pk).apply_async(queue=f"reflection-a-{os.getpid()}")
    wait_for(
        lambda: ReflectionRun.objects.filter(burst=burst, status="completed").exists(),
        timeout=30,
        what="the single chain to complete",
    )
    assert outcome() == raced
    assert raced["run"][3]["accepted"] == 2  # what test_pipeline's world yields in-process
