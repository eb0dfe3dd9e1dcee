"""A reflection run per burst, moved through its stages only as its transition table allows."""

from __future__ import annotations

import pytest

from bursts.models import Burst
from reflection.errors import IllegalTransition, NotFound
from reflection.models import REFLECTION_RUN_TRANSITIONS, ReflectionRun
from reflection.services.runs import reflection_run_start, reflection_run_transition

pytestmark = pytest.mark.django_db


def test_it_starts_one_run_per_burst(burst: Burst) -> None:
    run, created = reflection_run_start(burst.pk)
    again, created_again = reflection_run_start(burst.pk)
    assert (created, created_again) == (True, False)
    assert again.pk == run.pk
    assert (run.status, run.wave_id) == ("started", burst.wave_id)


def test_it_refuses_a_missing_burst(db: object) -> None:
    with pytest.raises(NotFound):
        reflection_run_start(10**9)


def test_it_walks_the_stages_to_completed(burst: Burst) -> None:
    run, _ = reflection_run_start(burst.pk)
    for stage in ("extracting", "proposing", "evaluating", "curating"):
        run = reflection_run_transition(run.pk, stage, timings={stage: 1.5})
        assert run.finished_at is None
    run = reflection_run_transition(run.pk, "completed", counts={"deltas": 2})
    assert (run.status, run.counts, run.timings) == ("completed", {"deltas": 2}, {"curating": 1.5})
    assert run.finished_at is not None


def test_it_refuses_illegal_transitions(burst: Burst) -> None:
    run, _ = reflection_run_start(burst.pk)
    with pytest.raises(IllegalTransition):
        reflection_run_transition(run.pk, "curating")  # skips stages
    reflection_run_transition(run.pk, "cached")
    with pytest.raises(IllegalTransition):
        reflection_run_transition(run.pk, "extracting")  # cached is terminal
    assert ReflectionRun.objects.get(pk=run.pk).status == "cached"


def test_an_error_may_be_tried_again(burst: Burst) -> None:
    run, _ = reflection_run_start(burst.pk)
    reflection_run_transition(run.pk, "extracting")
    reflection_run_transition(run.pk, "error", error="provider down")
    run = reflection_run_transition(run.pk, "started")
    assert run.status == "started"


def test_every_status_has_its_transitions() -> None:
    from reflection.models import ReflectionRunStatus

    assert set(REFLECTION_RUN_TRANSITIONS) == set(ReflectionRunStatus.values)


@pytest.mark.django_db(transaction=True)
def test_two_callers_at_once_get_the_same_run() -> None:
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from django.db import connection

    from bursts.models import Wave

    burst = Burst.objects.create(wave=Wave.objects.create(), number=1)
    barrier = Barrier(4)

    def start() -> tuple[int, bool]:
        try:
            barrier.wait()
            run, created = reflection_run_start(burst.pk)
            return run.pk, created
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: start(), range(4)))
    assert len({pk for pk, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert ReflectionRun.objects.count() == 1
