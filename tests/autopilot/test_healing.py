"""Healing: a hung agent cancelled and run again to the end on a real worker, the integration
branch's failing checks filing one healing quantum, a failing endpoint marked down."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.utils import timezone

from autopilot.models import BaseCheck, Hub, HubTransition
from autopilot.services.healing import base_check_run
from autopilot.services.hub import hub_get, hub_resume, hub_tick
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus, WaveStatus
from bursts.services import wave_start
from core.models import Event
from psychonauts.routing.endpoints import endpoint_down, endpoint_failure, endpoints_failing
from psychonauts.workspaces.git import git
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum, QuantumStatus
from quanta.services import quantum_create
from repos.services import repository_create, repository_default, repository_update
from tests.bursts.conftest import Worker, fast_settings, make_worker, pipeline, step_log, wait_wave

__all__ = ["fast_settings", "make_worker", "step_log"]

# The coder's first attempt hangs in its model call (far longer than the stuck limit); the
# attempt after it answers at once.
HANGING_CODER = """
name: hanging-coder
match: {roles: [coder], labels: [hangs]}
turns:
  - sleep: 12
    text: "Woke up too late."
    attempts: [1]
  - text: "Done on attempt {attempt}."
"""


def hub_running() -> None:
    """Resumed, scanned and contemplated just now: idle, it would rest."""
    hub_get()
    hub_resume(by="op")
    now = timezone.now()
    Hub.objects.filter(pk=1).update(scanned_at=now, contemplated_at=now)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stuck_agent_is_cancelled_requeued_and_its_run_finishes(
    make_worker: Callable[..., Worker], tmp_path: Path, settings: Any, redis_client: redis.Redis
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "hanging-coder.yaml").write_text(HANGING_CODER, encoding="utf-8")
    make_worker(
        "healing",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
        ANNIHILATION_TEXT_FLUSH_S="0",
        ANNIHILATION_AUTOPILOT_TICK_S="3600",  # only this test's ticks
    )
    settings.AUTOPILOT_STUCK_S = 2.0
    settings.SPEND_CAP_DAY_USD = 0.0
    pipeline("solo", ("sequential", ["coder"]), default=True)
    quantum = quantum_create(title="hangs once", labels=["hangs"])
    wave = wave_start()
    wait_for(
        lambda: AgentRun.objects.filter(quantum=quantum, status=AgentStatus.RUNNING).exists(),
        "the coder to start",
    )
    hub_running()
    # Not stuck yet: the hub rests.
    assert hub_tick().state == "resting"
    time.sleep(3.5)  # the hung model call has said nothing for longer than the limit

    tick = hub_tick()

    assert tick.state == "healing", tick.reason
    assert "1 agent stuck with no progress for" in tick.reason
    assert any("cancelled" in h for h in tick.healed)
    first = AgentRun.objects.get(quantum=quantum, attempt=1)
    assert first.status == AgentStatus.CANCELLED
    assert first.error.startswith("stuck: no progress for ")
    assert "(the limit is 2 s); cancelled by the autopilot's healing" in first.error
    wave = wait_wave(wave.pk, timeout=60)
    assert wave.status == WaveStatus.DONE
    second = AgentRun.objects.get(quantum=quantum, attempt=2)
    assert second.status == AgentStatus.DONE
    assert second.result == "Done on attempt 2."
    assert QuantumRun.objects.get(quantum=quantum).status == RunStatus.DONE
    quantum.refresh_from_db()
    assert quantum.status == QuantumStatus.CLOSED
    event = Event.objects.get(topic="autopilot:healing", type="agent_unstuck")
    assert event.payload["agent_run_id"] == first.pk and event.payload["requeued"] is True
    t = HubTransition.objects.filter(to_state="healing").get()
    assert t.by == "tick" and t.snapshot["stuck"][0]["agent_run_id"] == first.pk
    # Healed: the next tick leaves healing, and nothing is cancelled twice.
    tick = hub_tick()
    assert tick.state == "resting" and tick.healed == ()
    assert AgentRun.objects.filter(quantum=quantum).count() == 2


@pytest.mark.django_db
def test_the_base_branchs_failures_file_one_healing_quantum(
    repo: Path, settings: Any, redis_client: redis.Redis
) -> None:
    settings.TETHER_VERIFY_COMMANDS = ["test -f CHANGELOG.md"]
    settings.AUTOPILOT_SCAN_TEST_COMMAND = "python3 calc.py"
    settings.AUTOPILOT_BASE_FAILURES = 2
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_running()

    # Never checked: the tick sends the check (once per period, whatever the ticks).
    assert "autopilot.base_check" in hub_tick().sent
    assert "autopilot.base_check" not in hub_tick().sent

    first = base_check_run()
    assert first is not None and not first.ok
    assert first.sha == git("rev-parse", "HEAD", cwd=repo)
    assert "FAILED: `test -f CHANGELOG.md` (exit status 1)" in first.summary
    assert "PASSED: `python3 calc.py`" in first.summary
    assert hub_tick().state == "resting"  # one failure is not a pattern
    assert not Quantum.objects.filter(labels__contains=["healing"]).exists()

    base_check_run()
    tick = hub_tick()

    assert tick.state == "healing", tick.reason
    assert "the integration branch of default failed its checks 2 times in a row" in tick.reason
    [healing] = Quantum.objects.filter(labels__contains=["healing"])
    assert healing.labels == ["autopilot", "autopilot:healing", "healing"]
    assert healing.priority == 0 and healing.status == QuantumStatus.OPEN
    assert "failed its checks 2 times in a row" in healing.body
    assert "test -f CHANGELOG.md" in healing.body
    assert BaseCheck.objects.latest("id").quantum_id == healing.pk
    assert (
        Event.objects.filter(topic="autopilot:healing", type="healing_quantum_filed").count() == 1
    )

    # Still failing while it is open: not filed again; the hub executes the healing quantum.
    base_check_run()
    tick = hub_tick()
    assert tick.state == "executing" and "1 autopilot quantum ready" in tick.reason
    assert Quantum.objects.filter(labels__contains=["healing"]).count() == 1

    # Fixed on the branch: the next check passes and the streak is over.
    (repo / "CHANGELOG.md").write_text("# changes\n")
    git("add", "CHANGELOG.md", cwd=repo)
    git("commit", "-q", "-m", "a changelog", cwd=repo, author="op")
    check = base_check_run()
    assert check is not None and check.ok and "PASSED: `test -f CHANGELOG.md`" in check.summary


@pytest.mark.django_db
def test_each_repository_is_checked_and_healed_on_its_own(
    repo: Path, tmp_path: Path, settings: Any, redis_client: redis.Redis
) -> None:
    settings.TETHER_VERIFY_COMMANDS = ["test -f CHANGELOG.md"]  # the default's branch fails
    settings.AUTOPILOT_SCAN_TEST_COMMAND = ""
    settings.AUTOPILOT_BASE_FAILURES = 2
    settings.SPEND_CAP_DAY_USD = 0.0
    default = repository_default()
    other = repository_create(
        name="second",
        location=str(demo_repo_ensure(tmp_path / "second")),
        inspect=repository_inspect,
        verify_commands=["python3 calc.py"],
    )
    hub_running()

    # Each repository's check is due and sent on its own.
    tick = hub_tick()
    assert tick.sent.count("autopilot.base_check") == 2
    assert "autopilot.base_check" not in hub_tick().sent
    for _ in range(2):
        assert base_check_run(repository_id=default.pk) is not None
        assert base_check_run(repository_id=other.pk) is not None
    assert [c.ok for c in BaseCheck.objects.filter(repository=default)] == [False, False]
    assert [c.ok for c in BaseCheck.objects.filter(repository=other)] == [True, True]
    assert BaseCheck.objects.filter(repository=other).first().sha == git(  # type: ignore[union-attr]
        "rev-parse", "HEAD", cwd=tmp_path / "second"
    )

    tick = hub_tick()

    # The broken one is healed in its own repository; the other is left as it is.
    assert tick.state == "healing", tick.reason
    assert "the integration branch of default failed its checks 2 times" in tick.reason
    assert "second" not in tick.reason
    [healing] = Quantum.objects.filter(labels__contains=["healing"])
    assert healing.repository_id == default.pk and "repository default" in healing.body
    assert not BaseCheck.objects.filter(repository=other, quantum__isnull=False).exists()

    # The second one breaks too: its own healing quantum, though the default's is still open.
    repository_update(name="second", inspect=repository_inspect, verify_commands=["false"])
    for _ in range(2):
        base_check_run(repository_id=other.pk)
    tick = hub_tick()
    assert "the integration branch of second failed its checks 2 times" in tick.reason
    assert "of default" not in tick.reason  # its healing quantum is open: nothing to file
    healings = Quantum.objects.filter(labels__contains=["healing"]).order_by("pk")
    assert [q.repository_id for q in healings] == [default.pk, other.pk]
    assert "`false` (exit status 1)" in healings[1].body
    assert BaseCheck.objects.filter(repository=default).latest("id").quantum_id == healing.pk


@pytest.mark.django_db
def test_no_check_is_run_or_sent_when_none_is_configured(
    repo: Path, settings: Any, redis_client: redis.Redis
) -> None:
    settings.TETHER_VERIFY_COMMANDS = []
    settings.AUTOPILOT_SCAN_TEST_COMMAND = ""
    hub_running()
    assert base_check_run() is None
    assert "autopilot.base_check" not in hub_tick().sent
    assert not BaseCheck.objects.exists()


@pytest.mark.django_db
def test_a_failing_endpoint_is_marked_down(settings: Any, redis_client: redis.Redis) -> None:
    settings.AUTOPILOT_ENDPOINT_FAILURES = 3
    settings.AUTOPILOT_ENDPOINT_DOWN_S = 60.0
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_running()
    for _ in range(2):
        endpoint_failure("anthropic", "claude-x")
    assert hub_tick().state == "resting"  # two failures are not enough
    endpoint_failure("anthropic", "claude-x")

    tick = hub_tick()

    assert tick.state == "healing"
    assert "endpoint anthropic/claude-x failing (3 failures in a row)" in tick.reason
    assert tick.healed == ("endpoint anthropic/claude-x marked down",)
    assert endpoint_down("anthropic", "claude-x")
    ttl = redis_client.pttl("endpoints:down:anthropic|claude-x")
    assert 55_000 < ttl <= 60_000
    event = Event.objects.get(topic="autopilot:healing", type="endpoint_marked_down")
    assert event.payload["provider"] == "anthropic" and event.payload["failures"] == 3
    # Down now: nothing more to heal.
    assert endpoints_failing() == []
    tick = hub_tick()
    assert tick.state == "resting" and tick.healed == ()


@pytest.mark.django_db
def test_a_stuck_agent_is_cancelled_even_without_a_healing_budget(
    settings: Any, redis_client: redis.Redis
) -> None:
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.runtime.runs import agent_run_create

    roles_sync_defaults()
    settings.AUTOPILOT_STUCK_S = 60.0
    settings.AUTOPILOT_BUDGET_STATE_USD = {**settings.AUTOPILOT_BUDGET_STATE_USD, "healing": 0.0}
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_running()
    run = agent_run_create(quantum_id=quantum_create(title="alone").pk, role="coder")
    long_ago = timezone.now() - timedelta(minutes=5)
    AgentRun.objects.filter(pk=run.pk).update(
        status=AgentStatus.RUNNING, started_at=long_ago, heartbeat_at=timezone.now()
    )

    tick = hub_tick()

    assert tick.state == "resting" and "healing waits for budget" in tick.reason
    assert tick.healed == (f"agent {run.agent_id} (run {run.pk}) cancelled",)
    run.refresh_from_db()
    assert run.status == AgentStatus.CANCELLED and "stuck: no progress for 5 min" in run.error


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_tick_sends_the_base_check_to_a_real_worker(
    make_worker: Callable[..., Worker], tmp_path: Path, settings: Any, redis_client: redis.Redis
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    make_worker(
        "checks",
        beat=False,
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_TETHER_VERIFY_COMMANDS="python3 calc.py|||test -f CHANGELOG.md",
    )
    settings.ANNIHILATION_REPO = repo
    settings.ANNIHILATION_HOME = home
    settings.TETHER_VERIFY_COMMANDS = ["python3 calc.py", "test -f CHANGELOG.md"]
    settings.SPEND_CAP_DAY_USD = 0.0
    hub_running()

    assert "autopilot.base_check" in hub_tick().sent

    wait_for(BaseCheck.objects.exists, "the worker's check", timeout=60)
    check = BaseCheck.objects.get()
    assert check.sha == git("rev-parse", "HEAD", cwd=repo) and not check.ok
    assert "PASSED: `python3 calc.py`" in check.summary
    assert "FAILED: `test -f CHANGELOG.md` (exit status 1)" in check.summary
    event = Event.objects.get(topic="autopilot:healing", type="base_checked")
    assert event.payload["failed"] == ["test -f CHANGELOG.md"]
    # Checked just now: not due again within AUTOPILOT_BASE_CHECK_S.
    assert "autopilot.base_check" not in hub_tick().sent
