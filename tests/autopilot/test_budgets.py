"""Budgets on the real agent runtime: the ledger per day, scope and goal; a state's, the
autopilot's and a goal's budget holding their runs before a model call while other work goes
on; the global cap holding every agent; a raised budget resuming held runs from their
checkpoint without repeating a call. Postgres, Redis, and a Celery worker for the whole path."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from annihilation.celery import app
from autopilot.labels import filed_labels, goal_label
from autopilot.models import Goal, GoalStatus, Hold, Spend
from autopilot.services.budgets import NEED_KEY, holds_release, spend_flush, spend_record
from autopilot.spend import budget_left, budget_status, cap_status, spend_by_day, spend_today
from bursts.models import AgentRun, AgentStatus, Wave, WaveStatus
from bursts.services import wave_start
from core.models import Event
from core.redis import get_redis
from psychonauts.models import AgentTurn, Usage
from psychonauts.runtime.budget import cost_usd
from psychonauts.runtime.execute import agent_run_execute
from quanta.models import Quantum, QuantumStatus
from tests.bursts.conftest import Worker, pipeline, wait_wave, worker_env
from tests.polling import wait_for
from tests.psychonauts.conftest import make_quantum, make_run, scripts
from tests.tether.conftest import active_tasks
from tether.models import Reaching
from tether.services import reaching_answer
from tether.services.reachings import agents_rewake

__all__ = ["make_quantum", "make_run", "scripts"]

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "claude-haiku-4-5"
TOKENS = 200_000  # output tokens a paid turn reports: $1 at the model's price
PAID = f"usage: {{output_tokens: {TOKENS}, model: {MODEL}}}"

# Three paid calls: two turns that look around, then the answer.
THREE_CALLS = f"""
name: paid
match: {{labels: [paid]}}
turns:
  - text: "Looking."
    tools:
      - list_dir: {{path: "."}}
    {PAID}
  - text: "Looking again."
    tools:
      - list_dir: {{path: "."}}
    {PAID}
  - text: "Done."
    {PAID}
"""
FREE = """
name: free
match: {labels: [free]}
turns:
  - text: "Looking."
    tools:
      - list_dir: {path: "."}
  - text: "Done."
"""


@pytest.fixture
def one_dollar() -> Decimal:
    usd = cost_usd(MODEL, 0, TOKENS)
    assert usd == Decimal("1.000000")  # the test's arithmetic rests on it
    return usd


@pytest.fixture
def budgets(
    repo: Path, scripts: Callable[[str, str], None], settings: Any, one_dollar: Decimal
) -> Iterator[Any]:
    """The scripts, generous budgets (each test narrows one) and an empty ledger."""
    scripts("paid", THREE_CALLS)
    scripts("free", FREE)
    settings.SPEND_CAP_DAY_USD = 0.0
    settings.AUTOPILOT_BUDGET_DAY_USD = 100.0
    settings.AUTOPILOT_BUDGET_STATE_USD = {
        "executing": 100.0,
        "improving": 100.0,
        "contemplating": 100.0,
        "healing": 100.0,
    }
    spend_flush()  # zero-cost calls another test of this process counted
    Spend.objects.all().delete()
    yield settings
    spend_flush()


def run_on(make_run: Any, make_quantum: Any, *labels: str) -> AgentRun:
    run: AgentRun = make_run("coder", quantum=make_quantum(labels=list(labels)))
    return run


def execute(run: AgentRun) -> str:
    outcome = agent_run_execute(agent_run_id=run.pk)
    return outcome.status


def ledger() -> dict[tuple[str, int | None], tuple[Decimal, int]]:
    today = timezone.localdate()
    return {(s.scope, s.goal_id): (s.usd, s.calls) for s in Spend.objects.filter(day=today)}


def calls_made(run: AgentRun) -> int:
    return Usage.objects.filter(agent_run=run).count()


def events(event_type: str) -> list[dict[str, Any]]:
    return list(
        Event.objects.filter(topic="autopilot:budget", type=event_type)
        .order_by("pk")
        .values_list("payload", flat=True)
    )


def goal(budget: str | None = None, status: str = GoalStatus.ACTIVE) -> Goal:
    made: Goal = Goal.objects.create(
        title="a goal",
        success_criteria="it works",
        status=status,
        budget_usd=Decimal(budget) if budget is not None else None,
    )
    return made


def test_it_records_each_call_per_day_scope_and_goal(budgets, make_run, make_quantum):
    g = goal()
    improving = run_on(make_run, make_quantum, *filed_labels("improving"), "paid")
    operator = run_on(make_run, make_quantum, "paid")
    for_goal = run_on(make_run, make_quantum, *filed_labels("executing", goal_label(g.pk)), "paid")

    assert [execute(r) for r in (improving, operator, for_goal)] == ["done"] * 3

    three = (Decimal("3.000000"), 3)
    assert ledger() == {("improving", None): three, ("operator", None): three,
                        ("executing", g.pk): three}  # fmt: skip
    spent = spend_today()
    assert spent["improving"] == spent["operator"] == spent["executing"] == Decimal(3)
    assert spent["healing"] == 0
    row = Spend.objects.get(scope="operator")
    assert (row.tokens_in, row.tokens_out) == (0, 3 * TOKENS)
    days = spend_by_day(3)
    assert [d.day for d in days][-1] == timezone.localdate() and len(days) == 3
    assert days[-1].total == Decimal(9) and days[-1].calls == 9 and days[0].total == 0


def test_it_counts_zero_cost_calls_without_a_statement_each(budgets, make_run, make_quantum):
    runs = [run_on(make_run, make_quantum, *filed_labels("healing"), "free") for _ in range(3)]

    assert [execute(r) for r in runs] == ["done"] * 3

    assert ledger() == {}  # counted in the process, written later
    spend_flush()
    assert ledger() == {("healing", None): (Decimal(0), 6)}


def test_it_counts_a_goal_that_does_not_exist_under_no_goal(budgets):
    missing = goal_label(987_654)
    spend_record(labels=[missing], model="m", usd=Decimal(0), tokens_in=1, tokens_out=2)
    spend_record(labels=["team:a"], model="m", usd=Decimal("0.5"), tokens_in=3, tokens_out=4)

    assert ledger() == {("operator", None): (Decimal("0.5"), 2)}
    row = Spend.objects.get()
    assert (row.tokens_in, row.tokens_out) == (4, 6)


def test_it_holds_a_state_over_its_budget_while_operator_work_goes_on(
    budgets, make_run, make_quantum
):
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "improving": 1.0}
    improving = run_on(make_run, make_quantum, *filed_labels("improving"), "paid")
    operator = run_on(make_run, make_quantum, "paid")

    assert execute(improving) == "waiting"
    assert execute(operator) == "done"

    improving.refresh_from_db()
    assert improving.status == AgentStatus.WAITING
    assert calls_made(improving) == 1  # the second call was never made
    hold = Hold.objects.get()
    assert (hold.agent_run_id, hold.scope) == (improving.pk, "improving")
    assert "the improving budget is spent: $1.0000 of $1.0000" in hold.reason
    assert [e["agent_run_id"] for e in events("run_held")] == [improving.pk]
    assert budget_left("improving") == 0
    assert budget_left("executing") == Decimal(99)  # the day budget less the improving spend
    assert budget_status().holds == 1
    assert holds_release() == 0  # the budget still refuses


def test_it_holds_the_autopilots_work_over_its_day_budget(budgets, make_run, make_quantum):
    budgets.AUTOPILOT_BUDGET_DAY_USD = 2.0
    improving = run_on(make_run, make_quantum, *filed_labels("improving"), "paid")
    healing = run_on(make_run, make_quantum, *filed_labels("healing"), "paid")

    assert execute(improving) == "waiting"  # $2 spent: the day budget is reached
    assert execute(healing) == "waiting"  # held before its first call

    assert calls_made(improving) == 2 and calls_made(healing) == 0
    assert set(Hold.objects.values_list("scope", flat=True)) == {"autopilot"}
    assert budget_left("healing") == 0


def test_the_cap_holds_every_agent_and_a_higher_cap_resumes_them_from_their_checkpoint(
    budgets, make_run, make_quantum
):
    budgets.SPEND_CAP_DAY_USD = 1.5
    first = run_on(make_run, make_quantum, "paid")
    second = run_on(make_run, make_quantum, *filed_labels("executing"), "paid")

    assert execute(first) == "waiting"  # $1, then $2 >= $1.5: held before its third call
    assert execute(second) == "waiting"  # held before its first

    assert (calls_made(first), calls_made(second)) == (2, 0)
    assert set(Hold.objects.values_list("scope", flat=True)) == {"cap"}
    status = cap_status()
    assert (status.cap_usd, status.spent_usd, status.reached) == (Decimal("1.5"), Decimal(2), True)
    assert [e["spent_usd"] for e in events("cap_reached")] == ["2.000000"]
    assert budget_left("operator") == 0 and budget_left("executing") == 0
    assert holds_release() == 0

    budgets.SPEND_CAP_DAY_USD = 10.0
    assert holds_release() == 2

    assert not Hold.objects.exists()
    assert sorted(e["agent_run_id"] for e in events("released")) == sorted([first.pk, second.pk])
    for run in (first, second):
        run.refresh_from_db()
        assert (run.status, run.worker) == (AgentStatus.RUNNING, "")  # its task is sent
        assert execute(run) == "done"  # played here: the worker's part
        assert calls_made(run) == 3  # each call once, none repeated
        turns = AgentTurn.objects.filter(agent_run=run).values_list("index", flat=True)
        assert list(turns.order_by("index")) == [0, 1, 2]
    assert cap_status().spent_usd == Decimal(6)


def test_it_holds_the_call_that_would_go_over_before_spending(budgets, make_run, make_quantum):
    # The prompt alone, priced high, is worth more than the state's budget.
    budgets.PSYCHONAUTS_PRICES = {**budgets.PSYCHONAUTS_PRICES, "scripted": (100_000.0, 0.0)}
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "healing": 5.0}
    budgets.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 1000.0
    run = run_on(make_run, make_quantum, *filed_labels("healing"), "paid")

    assert execute(run) == "waiting"

    assert calls_made(run) == 0 and spend_today()["healing"] == 0
    assert Hold.objects.get().scope == "healing"
    assert holds_release() == 0  # room for less than the call needs is not enough


def test_a_goal_budget_holds_its_runs_until_it_is_raised(budgets, make_run, make_quantum):
    g = goal(budget="1")
    labels = [*filed_labels("executing", goal_label(g.pk)), "paid"]
    held = run_on(make_run, make_quantum, *labels)
    other = run_on(make_run, make_quantum, *filed_labels("executing"), "paid")

    assert execute(held) == "waiting"
    assert execute(other) == "done"  # another goal's (or no goal's) work goes on

    hold = Hold.objects.get()
    assert (hold.agent_run_id, hold.scope) == (held.pk, f"goal:{g.pk}")
    assert f"goal {g.pk}'s budget is spent: $1.0000 of $1.0000" in hold.reason

    Goal.objects.filter(pk=g.pk).update(budget_usd=Decimal("10"))
    assert holds_release() == 1
    assert execute(held) == "done" and calls_made(held) == 3


def test_it_cancels_a_held_run_whose_goal_was_abandoned(budgets, make_run, make_quantum):
    g = goal(budget="1")
    held = run_on(make_run, make_quantum, *filed_labels("executing", goal_label(g.pk)), "paid")
    assert execute(held) == "waiting"

    Goal.objects.filter(pk=g.pk).update(status=GoalStatus.ABANDONED)

    assert holds_release() == 0
    held.refresh_from_db()
    assert held.status == AgentStatus.CANCELLED and "goal" in held.error
    assert not Hold.objects.exists()
    assert [e["agent_run_id"] for e in events("cancelled")] == [held.pk]


def test_it_drops_the_hold_of_a_run_that_ended_meanwhile(budgets, make_run, make_quantum):
    budgets.SPEND_CAP_DAY_USD = 0.5
    run = run_on(make_run, make_quantum, "paid")
    assert execute(run) == "waiting"
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.CANCELLED)

    assert holds_release() == 0
    assert not Hold.objects.exists()


def test_it_releases_only_what_a_raised_budget_has_room_for(budgets, make_run, make_quantum):
    budgets.PSYCHONAUTS_PRICES = {**budgets.PSYCHONAUTS_PRICES, "scripted": (1000.0, 0.0)}
    budgets.PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = 1000.0
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "healing": 0.0}
    runs = [run_on(make_run, make_quantum, *filed_labels("healing"), "paid") for _ in range(3)]
    assert [execute(r) for r in runs] == ["waiting"] * 3
    needs = [Decimal(0)] * 3  # what each first call was estimated at (its prompt)
    for i, r in enumerate(runs):
        needs[i] = Decimal(str(redis_need(r.pk)))
    assert all(n > 0 for n in needs)

    # Room for the first two calls, not the third.
    budgets.AUTOPILOT_BUDGET_STATE_USD = {
        **budgets.AUTOPILOT_BUDGET_STATE_USD,
        "healing": float(needs[0] + needs[1]),
    }
    assert holds_release() == 2
    assert list(Hold.objects.values_list("agent_run_id", flat=True)) == [runs[2].pk]


def redis_need(agent_run_id: int) -> str:
    need = get_redis().hget(NEED_KEY, str(agent_run_id))
    assert need is not None
    return str(need)


# --- on a real worker ---------------------------------------------------------------------------


@pytest.fixture
def start_worker(repo: Path, tmp_path: Path, budgets: Any) -> Iterator[Callable[..., Worker]]:
    """Start a threads worker (beat off: the test releases holds itself) running the agent
    runtime on the test's repository and scripts, with the given settings."""
    started: list[Worker] = []

    def start(name: str, **env: str) -> Worker:
        worker = Worker(
            env=worker_env(
                ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
                ANNIHILATION_HOME=str(tmp_path / "home"),
                ANNIHILATION_REPO=str(repo),
                ANNIHILATION_SCRIPT_DIRS=str(tmp_path / "scripts"),
                ANNIHILATION_PROVIDER="",
                ANNIHILATION_TEXT_FLUSH_S="0",
                REDIS_URL=django_settings.REDIS_URL,
                **env,
            ),
            tmp=tmp_path,
            name=f"budgets-{name}-{os.getpid()}",
            beat=False,
        ).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    connection.close()


def agent_status(run_id: int) -> str:
    return str(AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first())


@pytest.mark.slow
def test_on_a_worker_the_cap_holds_agents_without_a_slot_and_a_raised_cap_resumes_them(
    start_worker, budgets, make_run, make_quantum
):
    worker = start_worker("capped", ANNIHILATION_SPEND_CAP_DAY_USD="1.5")
    budgets.SPEND_CAP_DAY_USD = 1.5  # this process (the hub's) sees the same
    busy = run_on(make_run, make_quantum, *filed_labels("improving"), "paid")
    late = run_on(make_run, make_quantum, "paid")
    app.send_task("psychonauts.tasks.execute_agent_run", args=(busy.pk,))
    wait_for(lambda: agent_status(busy.pk) == AgentStatus.WAITING, what="the cap to hold it")
    app.send_task("psychonauts.tasks.execute_agent_run", args=(late.pk,))
    wait_for(lambda: agent_status(late.pk) == AgentStatus.WAITING, what="the cap to hold it")

    wait_for(lambda: active_tasks(worker) == 0, timeout=5, what="the slots to be freed")
    assert (calls_made(busy), calls_made(late)) == (2, 0)
    assert Hold.objects.count() == 2 and cap_status().reached
    assert ledger() == {("improving", None): (Decimal(2), 2)}

    # The operator raises the cap: the workers restart with it, the next tick releases.
    worker.stop()
    start_worker("raised", ANNIHILATION_SPEND_CAP_DAY_USD="10")
    budgets.SPEND_CAP_DAY_USD = 10.0
    assert holds_release() == 2

    for run_id in (busy.pk, late.pk):
        wait_for(lambda: agent_status(run_id) == AgentStatus.DONE, what="the run to finish")  # noqa: B023
    assert (calls_made(busy), calls_made(late)) == (3, 3)
    assert not Hold.objects.exists()
    started = Event.objects.filter(type="started", payload__agent_run_id=busy.pk).count()
    assert started == 2  # executed twice: before the hold, after the release
    assert ledger() == {("improving", None): (Decimal(3), 3), ("operator", None): (Decimal(3), 3)}
    assert Quantum.objects.count() == 2


@pytest.mark.slow
def test_on_a_worker_a_wave_held_by_its_state_budget_finishes_once_the_budget_is_raised(
    start_worker, budgets, make_quantum
):
    budgets.BURSTS_EXECUTOR = "psychonauts"
    pipeline("one", ("sequential", ["coder"]), default=True)
    tight = start_worker("tight", ANNIHILATION_AUTOPILOT_BUDGET_EXECUTING_USD="1.5")
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "executing": 1.5}
    quantum = make_quantum(labels=[*filed_labels("executing"), "paid"])

    wave = wave_start()
    wait_for(lambda: Hold.objects.exists(), what="the state budget to hold the coder")
    coder = AgentRun.objects.get(quantum=quantum)
    wait_for(lambda: agent_status(coder.pk) == AgentStatus.WAITING, what="the coder to wait")
    assert Wave.objects.get(pk=wave.pk).status == WaveStatus.RUNNING
    assert calls_made(coder) == 2

    tight.stop()  # the operator raises the budget: the workers restart with it
    start_worker("roomy", ANNIHILATION_AUTOPILOT_BUDGET_EXECUTING_USD="10")
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "executing": 10.0}
    assert holds_release() == 1

    assert wait_wave(wave.pk).status == WaveStatus.DONE
    quantum.refresh_from_db()
    assert quantum.status == QuantumStatus.CLOSED
    assert calls_made(coder) == 3 and AgentRun.objects.filter(quantum=quantum).count() == 1
    assert ledger() == {("executing", None): (Decimal(3), 3)}


ASK_THEN_PAY = f"""
name: askpay
match: {{labels: [askpay]}}
turns:
  - text: "Which way?"
    tools:
      - ask_tether: {{question: "Keep it?", priority: normal, assumption: "keep", timeout_s: 300}}
    {PAID}
  - text: "Looking."
    tools:
      - list_dir: {{path: "."}}
    {PAID}
  - text: "Done."
"""


def test_the_tethers_sweep_leaves_a_run_a_budget_holds_alone(
    budgets, scripts, make_run, make_quantum
):
    scripts("askpay", ASK_THEN_PAY)
    budgets.AUTOPILOT_BUDGET_STATE_USD = {**budgets.AUTOPILOT_BUDGET_STATE_USD, "improving": 1.5}
    run = make_run("coder", quantum=make_quantum(labels=[*filed_labels("improving"), "askpay"]))
    assert execute(run) == "waiting"  # on the Tether
    reaching = Reaching.objects.get(agent_run=run)
    assert reaching_answer(reaching_id=reaching.pk, text="keep it").resumed
    assert execute(run) == "waiting"  # on the budget, its question long answered
    AgentRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=5))

    assert agents_rewake() == []

    assert agent_status(run.pk) == AgentStatus.WAITING and Hold.objects.filter(agent_run=run)
