"""The reflection pipeline over a burst: its stages, the evidence gate, curation, the stored
result on a second run, an error recorded without raising, and the trigger on burst close."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from bursts.models import AgentRun, Burst, BurstPhase, QuantumRun
from bursts.services.bursts import burst_close
from core.events import publish
from core.models import Event, Session
from psychonauts.models import DiaryEntry
from quanta.services import quantum_create
from reflection import curation, pipeline
from reflection.models import PlaybookDelta, PlaybookRule, ReflectionRun
from reflection.services.playbook import rule_create
from reflection.text import polarity
from tests.bursts.conftest import fast_settings, module_worker, worker  # noqa: F401

pytestmark = pytest.mark.django_db

LEARNING = "Run the unittest suite before committing a migration"
FAILURE = "pytest reported missing migration for accounts"
CHALLENGE = "flaky fixtures around websocket reconnection"


def agent(
    burst: Burst, role: str, *, status: str = "done", error: str = "", attempt: int = 1
) -> AgentRun:
    quantum = quantum_create(title=f"q {role}")
    quantum_run = QuantumRun.objects.create(
        wave_id=burst.wave_id, burst=burst, quantum=quantum, pipeline_name="test"
    )
    return AgentRun.objects.create(
        agent_id=f"{quantum.pk}_s0_{role}",
        attempt=attempt,
        quantum=quantum,
        quantum_run=quantum_run,
        role=role,
        status=status,
        error=error,
    )


def session_with(run: AgentRun, *texts: str) -> Session:
    session = Session.objects.create(kind="agent_run", ref=str(run.pk), title=run.agent_id)
    for text in texts:
        publish(f"agent:{run.agent_id}", "text", {"text": text}, session_id=session.pk)
    return session


@pytest.fixture
def world(burst: Burst) -> dict[str, AgentRun]:
    """A burst with a coder that learned something, a tester that failed twice and a reviewer
    whose challenge no session supports."""
    coder = agent(burst, "coder")
    DiaryEntry.objects.create(agent_run=coder, kind="learning", text=LEARNING)
    DiaryEntry.objects.create(agent_run=coder, kind="accomplishment", text="wrote the view")
    tester = agent(burst, "tester", status="error", error=f"{FAILURE}\ntraceback ...")
    retry = AgentRun.objects.create(
        agent_id=tester.agent_id,
        attempt=2,
        quantum=tester.quantum,
        quantum_run=tester.quantum_run,
        role="tester",
        status="error",
        error=FAILURE,
    )
    reviewer = agent(burst, "reviewer")
    DiaryEntry.objects.create(agent_run=reviewer, kind="challenge", text=CHALLENGE)
    DiaryEntry.objects.create(agent_run=reviewer, kind="learning", text="x" * 5000)  # malformed
    session_with(coder, f"note: {LEARNING}")
    session_with(tester, f"FAILED: {FAILURE}")
    session_with(retry, f"FAILED again: {FAILURE}; {LEARNING}")
    return {"coder": coder, "tester": tester, "retry": retry, "reviewer": reviewer}


def test_it_walks_every_stage_and_applies_the_supported_proposals(
    burst: Burst, world: dict[str, AgentRun]
) -> None:
    run, cached = pipeline.reflect_burst(burst.pk)
    assert run is not None and not cached
    assert run.status == "completed", run.error
    assert set(run.timings) == {"started", "extracting", "proposing", "evaluating", "curating"}
    assert run.counts["agent_runs"] == 4
    assert (run.counts["findings"], run.counts["skipped"], run.counts["proposed"]) == (3, 1, 3)
    assert (run.counts["unsupported"], run.counts["accepted"]) == (1, 2)
    topics = list(
        Event.objects.filter(topic__startswith="reflection:")
        .order_by("pk")
        .values_list("topic", flat=True)
    )
    assert topics == [
        f"reflection:{s}"
        for s in ("started", "extracting", "proposing", "evaluating", "curating", "completed")
    ]

    learned = PlaybookRule.objects.get(text=LEARNING)
    assert (learned.kind, learned.roles, learned.maturity) == ("rule", ["coder"], "candidate")
    assert learned.evidence_agent_run_ids == [world["coder"].pk]
    assert learned.evidence_event_ids  # the coder's session events
    avoid = PlaybookRule.objects.get(kind="anti_pattern")
    assert avoid.text == f"Avoid: {FAILURE} (tester, failed 2 times)"
    assert sorted(avoid.evidence_agent_run_ids) == sorted([world["tester"].pk, world["retry"].pk])

    unsupported = PlaybookDelta.objects.get(text=f"Avoid: {CHALLENGE}")
    assert unsupported.status == "rejected"
    assert unsupported.reason.startswith("evidence gate: 0 matching session(s), 2 needed")
    assert not PlaybookRule.objects.filter(text__contains="websocket").exists()


def test_the_evidence_gate_follows_its_setting(
    burst: Burst, world: dict[str, AgentRun], settings: Any
) -> None:
    settings.REFLECTION_EVIDENCE_MIN_SESSIONS = 3
    run, _ = pipeline.reflect_burst(burst.pk)
    assert run is not None and run.status == "completed"
    assert run.counts["unsupported"] == 3
    assert not PlaybookRule.objects.exists()


def test_a_second_reflection_of_the_burst_returns_the_stored_result(
    burst: Burst, world: dict[str, AgentRun]
) -> None:
    first, _ = pipeline.reflect_burst(burst.pk)
    deltas = PlaybookDelta.objects.count()
    again, cached = pipeline.reflect_burst(burst.pk)
    assert cached and again is not None and first is not None
    assert (again.pk, again.status, again.counts) == (first.pk, "completed", first.counts)
    assert PlaybookDelta.objects.count() == deltas


def test_curation_drops_duplicates_and_conflicts_and_inverts_failing_rules(
    burst: Burst, world: dict[str, AgentRun]
) -> None:
    same = rule_create(text=LEARNING.upper() + ".")
    opposite = rule_create(text=f"Always {FAILURE} (tester, failed 2 times)")
    failing = rule_create(text="Commit straight to main")
    PlaybookRule.objects.filter(pk=failing.pk).update(harmful=3, helpful=1)

    run, _ = pipeline.reflect_burst(burst.pk)
    assert run is not None
    assert run.status == "completed", run.error
    assert (run.counts["duplicates"], run.counts["conflicts"], run.counts["inverted"]) == (1, 1, 1)
    assert PlaybookDelta.objects.get(text=LEARNING).reason == f"duplicate of rule #{same.pk}"
    conflict = PlaybookDelta.objects.get(text__startswith="Avoid: pytest")
    assert conflict.reason == f"conflicts with rule #{opposite.pk}"
    failing.refresh_from_db()
    assert failing.maturity == "deprecated"
    inverted = PlaybookRule.objects.get(text="Avoid: Commit straight to main")
    assert inverted.kind == "anti_pattern"


def test_polarity_pairs_a_rule_with_its_negation() -> None:
    assert polarity("Never push on Friday") == (True, "push on friday")
    assert polarity("Always push on Friday") == (False, "push on friday")
    assert polarity("Do not push on Friday")[0] is True
    assert polarity("push on Friday!") == (False, "push on friday")


def test_an_error_is_recorded_on_the_run_without_raising(
    burst: Burst, world: dict[str, AgentRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("search index unavailable")

    monkeypatch.setattr(curation, "sessions_count", broken)
    run, cached = pipeline.reflect_burst(burst.pk)
    assert run is not None and not cached
    assert run.status == "error"
    assert run.error == "evaluating: RuntimeError: search index unavailable"
    assert Event.objects.filter(topic="reflection:error").exists()

    monkeypatch.undo()
    run, cached = pipeline.reflect_burst(burst.pk)  # an errored run is tried again
    assert run is not None and (run.status, cached) == ("completed", False)


def test_reflect_runs_a_burst_and_a_wave_in_process(
    burst: Burst, world: dict[str, AgentRun]
) -> None:
    out = StringIO()
    call_command("reflect", "--burst", str(burst.pk), "--json", stdout=out)
    [result] = json.loads(out.getvalue())
    assert (result["status"], result["cached"], result["counts"]["accepted"]) == (
        "completed",
        False,
        2,
    )
    Burst.objects.filter(pk=burst.pk).update(phase=BurstPhase.DONE)
    out = StringIO()
    call_command("reflect", "--wave", str(burst.wave_id), "--json", stdout=out)
    [again] = json.loads(out.getvalue())
    assert (again["reflection_run"], again["cached"]) == (result["reflection_run"], True)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    from core.celery import app

    was = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = was


def test_closing_a_burst_sends_its_reflection_chain(
    burst: Burst,
    world: dict[str, AgentRun],
    eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        burst_close(burst=burst)
        assert not ReflectionRun.objects.exists()  # deferred until the close commits
    assert callbacks
    run = ReflectionRun.objects.get(burst=burst)
    assert run.status == "completed", run.error
    assert run.counts["accepted"] == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_wave_is_reflected_on_by_the_workers(worker: Any) -> None:  # noqa: F811
    from bursts.services import wave_start
    from tests.bursts.conftest import pipeline as pipeline_save
    from tests.bursts.conftest import wait_wave
    from tests.polling import wait_for

    pipeline_save("one", {"mode": "sequential", "agents": ["coder"], "retries": 1}, default=True)
    quantum_create(title="flaky", body="fail coder 1")
    wave = wait_wave(wave_start().pk)
    burst = Burst.objects.get(wave=wave)

    def reflected() -> bool:
        return ReflectionRun.objects.filter(burst=burst, status="completed").exists()

    wait_for(reflected, timeout=20)
    run = ReflectionRun.objects.get(burst=burst)
    assert run.counts["agent_runs"] == 2  # the failed attempt and its retry
    assert run.counts["findings"] == 1  # the failure
    assert run.counts["proposed"] == 1
