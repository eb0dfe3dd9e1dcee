"""The hub's tick and the operator's commands, on the real database, Redis and a real worker."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from autopilot.errors import InvalidHubCommand
from autopilot.labels import filed_labels
from autopilot.models import Hold, Hub, HubTransition
from autopilot.services.budgets import spend_record
from autopilot.services.hub import (
    HOLDS_TASK,
    hub_force,
    hub_get,
    hub_pause,
    hub_resume,
    hub_tick,
)
from bursts.models import Wave, WaveStatus
from core.models import Event
from quanta.models import Quantum
from quanta.services import quantum_create
from tests.bursts.conftest import fast_settings, make_worker, pipeline, step_log, wait_wave
from tests.psychonauts.conftest import make_quantum, make_run

__all__ = ["fast_settings", "make_quantum", "make_run", "make_worker", "step_log"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def hub(redis_client: redis.Redis, settings: Any) -> Hub:
    """A running (resumed) hub whose last scan and contemplation are recent: idle, it rests."""
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_get()
    hub_resume(by="op")
    now = timezone.now()
    Hub.objects.filter(pk=1).update(scanned_at=now, contemplated_at=now)
    return Hub.objects.get(pk=1)


def history() -> list[tuple[str, str, str]]:
    return list(HubTransition.objects.order_by("id").values_list("from_state", "to_state", "by"))


def test_it_starts_paused_and_a_tick_only_records_that_it_ran(redis_client: redis.Redis) -> None:
    tick = hub_tick()
    assert tick.paused and not tick.changed and tick.sent == ()
    row = Hub.objects.get(pk=1)
    assert row.paused and row.tick_at is not None and row.state == "resting"
    assert "resume" in row.paused_reason
    assert not HubTransition.objects.exists()


def test_it_records_a_transition_with_its_reason_and_snapshot(hub: Hub) -> None:
    quantum_create(title="Tidy the parser", labels=filed_labels("improving", "improvement"))
    tick = hub_tick()
    assert tick.state == "executing" and tick.changed
    assert "wave_start" in " ".join(tick.sent)
    t = HubTransition.objects.order_by("-id").first()
    assert t is not None
    assert (t.from_state, t.to_state, t.by) == ("resting", "executing", "tick")
    assert "1 autopilot quantum ready" in t.reason
    assert "$15.00 of the executing budget's $15.00 left today" in t.reason
    assert t.snapshot["ready"] == 1 and t.snapshot["paused"] is False
    event = Event.objects.filter(topic="autopilot:hub", type="state_changed").latest("id")
    assert event.payload["to"] == "executing" and event.payload["from"] == "resting"
    hub = Hub.objects.get(pk=1)
    assert hub.state == "executing" and hub.reason == t.reason


def test_a_tick_that_changes_nothing_records_nothing(hub: Hub) -> None:
    hub_tick()
    assert Hub.objects.get(pk=1).state == "resting"
    before = HubTransition.objects.count()
    for _ in range(3):
        tick = hub_tick()
        assert tick.state == "resting" and not tick.changed
    assert HubTransition.objects.count() == before
    assert "nothing to do" in Hub.objects.get(pk=1).reason


def test_it_scans_when_idle_and_due_then_rests(hub: Hub) -> None:
    Hub.objects.filter(pk=1).update(scanned_at=timezone.now() - timedelta(hours=2))
    tick = hub_tick()
    assert tick.state == "improving" and tick.sent == ("autopilot.scan",)
    assert "the last scan was 2 h ago" in tick.reason
    row = Hub.objects.get(pk=1)
    assert row.scanned_at is not None and timezone.now() - row.scanned_at < timedelta(seconds=5)
    tick = hub_tick()  # scanned just now: nothing due
    assert tick.state == "resting" and tick.sent == ()
    assert [h[:2] for h in history()][-2:] == [("resting", "improving"), ("improving", "resting")]


def test_it_contemplates_when_idle_and_due(hub: Hub) -> None:
    Hub.objects.filter(pk=1).update(contemplated_at=None)
    tick = hub_tick()
    assert tick.state == "contemplating" and tick.sent == ("autopilot.contemplate",)
    assert Hub.objects.get(pk=1).contemplated_at is not None


def test_pause_and_resume_are_recorded_with_who_and_why(hub: Hub) -> None:
    hub_pause(by="alice", reason="deploying")
    row = Hub.objects.get(pk=1)
    assert row.paused and row.paused_reason == "deploying"
    quantum_create(title="x", labels=filed_labels("executing"))
    tick = hub_tick()
    assert tick.paused and tick.sent == () and Hub.objects.get(pk=1).state == "resting"
    hub_resume(by="bob")
    assert not Hub.objects.get(pk=1).paused
    reasons = list(HubTransition.objects.order_by("id").values_list("by", "reason"))
    assert ("alice", "paused by alice: deploying") in reasons
    assert ("bob", "resumed by bob (was paused)") in reasons
    assert hub_tick().state == "executing"


def test_force_keeps_a_state_until_resumed(hub: Hub) -> None:
    hub_force(state="contemplating", by="alice")
    row = Hub.objects.get(pk=1)
    assert row.state == "contemplating" and row.forced
    quantum_create(title="x", labels=filed_labels("executing"))  # work would mean executing
    for _ in range(2):
        assert hub_tick().state == "contemplating"
    last = HubTransition.objects.latest("id")
    assert (last.from_state, last.to_state, last.by) == ("resting", "contemplating", "alice")
    assert last.reason == "forced to contemplating by alice"
    hub_resume(by="alice")
    assert hub_tick().state == "executing"


def test_force_refuses_an_unknown_state_naming_the_states(hub: Hub) -> None:
    with pytest.raises(InvalidHubCommand) as refused:
        hub_force(state="dancing", by="alice")
    message = str(refused.value)
    assert "'dancing'" in message
    for state in ("executing", "improving", "contemplating", "resting", "healing"):
        assert state in message
    assert not Hub.objects.get(pk=1).forced


def test_the_global_cap_pauses_the_hub_and_lifts_with_it(hub: Hub, settings: Any) -> None:
    settings.SPEND_CAP_DAY_USD = 1.0
    spend_record(labels=["x"], model="m", usd=Decimal("1.25"), tokens_in=1, tokens_out=1)
    tick = hub_tick()
    assert tick.paused and tick.changed
    row = Hub.objects.get(pk=1)
    assert row.paused and row.paused_reason == "global spend cap $1.25 of $1.00 reached"
    with pytest.raises(InvalidHubCommand, match="global spend cap"):
        hub_resume(by="alice")
    settings.SPEND_CAP_DAY_USD = 5.0
    tick = hub_tick()
    assert not tick.paused
    row = Hub.objects.get(pk=1)
    assert not row.paused and row.paused_reason == ""
    reasons = list(HubTransition.objects.filter(by="tick").values_list("reason", flat=True))
    assert "global spend cap $1.25 of $1.00 reached" in reasons
    assert any("no longer holds: $1.25 spent today of $5.00" in r for r in reasons)


def test_an_operator_pause_stays_when_the_cap_lifts(hub: Hub, settings: Any) -> None:
    hub_pause(by="alice", reason="holiday")
    settings.SPEND_CAP_DAY_USD = 1.0
    spend_record(labels=["x"], model="m", usd=Decimal("2"), tokens_in=1, tokens_out=1)
    hub_tick()
    assert Hub.objects.get(pk=1).paused_reason == "holiday"
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_tick()
    row = Hub.objects.get(pk=1)
    assert row.paused and row.paused_reason == "holiday"


def test_a_paused_hub_still_sends_the_budget_holds_to_be_released(
    redis_client: redis.Redis, make_run: Any
) -> None:
    hub_tick()
    assert hub_tick().sent == ()
    run = make_run("coder")
    Hold.objects.create(agent_run=run, scope="cap", reason="global spend cap reached")
    tick = hub_tick()
    assert tick.paused and tick.sent == (HOLDS_TASK,)


def test_a_tick_costs_a_few_statements(hub: Hub) -> None:
    quantum_create(title="x", labels=filed_labels("executing"))
    hub_tick()
    with CaptureQueriesContext(connection) as queries:
        hub_tick()
    # The transaction (here a savepoint), the hub's row locked and stamped with the snapshot in
    # one statement, the budgets' one; nothing changed, nothing more is written.
    assert len(queries.captured_queries) == 4, [q["sql"][:80] for q in queries]


@pytest.mark.django_db(transaction=True)
def test_a_tick_that_finds_another_holding_the_hub_returns_at_once(
    redis_client: redis.Redis,
) -> None:
    hub_get()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            Hub.objects.select_for_update().get(pk=1)
            held.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        tick = hub_tick()
        assert tick.skipped and time.monotonic() - started < 1
    finally:
        release.set()
        thread.join()
    assert not hub_tick().skipped


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_executing_starts_an_autopilot_wave_on_a_real_worker(
    redis_client: redis.Redis, make_worker: Any, settings: Any
) -> None:
    settings.SPEND_CAP_DAY_USD = 0.0
    make_worker(beat=False)
    pipeline("one-coder", ("sequential", ["coder"]), default=True)
    mine = [
        quantum_create(title=f"autopilot work {n}", labels=filed_labels("executing"))
        for n in range(3)
    ]
    theirs = quantum_create(title="the operator's own work")
    hub_get()
    hub_resume(by="op")
    tick = hub_tick()
    assert tick.state == "executing" and "autopilot.wave_start" in tick.sent
    deadline = time.monotonic() + 20
    while not Wave.objects.exists():
        assert time.monotonic() < deadline, "no wave started"
        time.sleep(0.1)
    wave = Wave.objects.get()
    assert wave.labels == ["autopilot"] and wave.started_by == "autopilot"
    # A second tick while it runs (or once it ended) starts no other wave.
    hub_tick()
    wave = wait_wave(wave.pk)
    assert wave.status == WaveStatus.DONE
    assert Wave.objects.count() == 1
    statuses = dict(Quantum.objects.values_list("pk", "status"))
    assert all(statuses[q.pk] == "closed" for q in mine), statuses
    assert statuses[theirs.pk] == "open"
    # Nothing ready any more: the hub leaves executing.
    assert hub_tick().state != "executing"


def sent_messages(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    """The tasks waiting in the broker's default queue: (name, kwargs)."""
    found = []
    for raw in client.lrange("celery", 0, -1):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], body[1]))
    return found


def test_approved_goals_are_decomposed_while_executing(
    hub: Hub, redis_client: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    from autopilot.models import Goal
    from autopilot.services.goals.lifecycle import goal_approve, goal_create
    from autopilot.tasks import goals

    goal = goal_create(title="Greet in French", success_criteria="it says bonjour", by="alice")
    assert hub_tick().state == "resting"  # proposed goals wait for the operator
    goal_approve(goal_id=goal.pk, by="alice")

    with django_capture_on_commit_callbacks(execute=True):
        tick = hub_tick()

    assert tick.state == "executing" and tick.sent == ("autopilot.goals",)
    assert "1 approved goal awaiting decomposition" in tick.reason
    assert ("autopilot.goals", {"decompose": True}) in sent_messages(redis_client)
    # What the worker runs for that message: the goal's planner starts.
    assert goals(decompose=True) >= 1
    assert Goal.objects.get(pk=goal.pk).status == "decomposing"
    # While it is planned, every tick sends the goals' safety net, without decomposing.
    redis_client.delete("celery")
    with django_capture_on_commit_callbacks(execute=True):
        tick = hub_tick()
    assert tick.state == "executing" and "1 goal being decomposed" in tick.reason
    assert sent_messages(redis_client) == [("autopilot.goals", {"decompose": False})]


def test_active_goals_get_their_safety_net_in_any_state(
    hub: Hub, redis_client: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    from autopilot.models import Goal
    from autopilot.services.goals.lifecycle import goal_create

    goal = goal_create(title="Greet in German", success_criteria="it says hallo", by="alice")
    Goal.objects.filter(pk=goal.pk).update(status="active")  # its quanta run elsewhere
    hub_pause(by="alice")
    assert hub_tick().sent == ()  # paused: nothing
    hub_resume(by="alice")
    with django_capture_on_commit_callbacks(execute=True):
        tick = hub_tick()
    assert tick.state == "resting" and tick.sent == ("autopilot.goals",)
    assert sent_messages(redis_client) == [("autopilot.goals", {"decompose": False})]


def test_the_autopilots_wave_starts_once_and_only_when_executing(hub: Hub) -> None:
    from autopilot.services.hub import autopilot_wave_start

    assert autopilot_wave_start() is None  # resting: nothing to start
    quantum_create(title="x", labels=filed_labels("executing"))
    hub_tick()
    wave = autopilot_wave_start()
    assert wave is not None and wave.labels == ["autopilot"]
    assert autopilot_wave_start() is None  # one runs already
    assert Wave.objects.count() == 1
    tick = hub_tick()
    assert tick.state == "executing" and "autopilot.wave_start" not in tick.sent
    assert f"wave {wave.pk} running" in tick.reason
    hub_pause(by="alice")
    Wave.objects.filter(pk=wave.pk).update(status="cancelled")  # as if it ended
    assert autopilot_wave_start() is None  # paused: no new wave
