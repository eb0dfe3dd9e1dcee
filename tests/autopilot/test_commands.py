"""`manage.py goals ...` and `manage.py autopilot ...`: readable and --json output, exit 1 on
refusals, 2 on bad usage."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from autopilot.models import Goal, GoalStatus, GoalTransition, Hub, HubTransition, Spend
from quanta.services import quantum_create

pytestmark = pytest.mark.django_db


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def as_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--json"))


def add(title: str = "Faster ready query", *more: str) -> dict[str, Any]:
    data: dict[str, Any] = as_json(
        "goals", "add", "--title", title, "--criteria", "p95 under 5 ms", *more
    )
    return data


# --- goals ------------------------------------------------------------------------------------


def test_goals_add_list_show(db: Any) -> None:
    goal = add(
        "Dark mode",
        "--description", "the whole UI",
        "--verify", "pytest -q",
        "--verify", "ruff check .",
        "--priority", "1",
        "--label", "ui",
        "--label", "theme",
        "--budget", "12.5",
    )  # fmt: skip

    assert goal["status"] == "proposed" and goal["title"] == "Dark mode"
    assert goal["verify_commands"] == ["pytest -q", "ruff check ."]
    assert (goal["priority"], goal["labels"]) == (1, ["ui", "theme"])
    assert Decimal(goal["budget_usd"]) == Decimal("12.5")
    assert (goal["quanta_closed"], goal["quanta_total"]) == (0, 0)
    row = Goal.objects.get(pk=goal["id"])
    assert row.description == "the whole UI" and row.created_by

    other = add("Other")
    call_command("goals", "approve", str(other["id"]), stdout=StringIO())
    listed = as_json("goals", "list")
    assert [g["id"] for g in listed] == [goal["id"], other["id"]]  # proposed first
    assert [g["id"] for g in as_json("goals", "list", "--status", "approved")] == [other["id"]]
    text = run("goals", "list")
    assert "proposed (waiting for approval)" in text and "Dark mode" in text

    shown = as_json("goals", "show", str(goal["id"]))
    assert [h["to"] for h in shown["history"]] == ["proposed"]
    assert shown["quanta"] == [] and shown["planner_runs"] == []
    assert shown["last_verify"] is None
    readable = run("goals", "show", str(goal["id"]))
    assert "criteria:  p95 under 5 ms" in readable and "pytest -q; ruff check ." in readable


def test_goals_show_lists_the_decomposition(db: Any) -> None:
    goal = add()
    epic = quantum_create(title="epic", kind="epic")
    Goal.objects.filter(pk=goal["id"]).update(epic=epic)
    first = quantum_create(title="Index the column", parent_id=epic.pk)
    second = quantum_create(title="Use it", parent_id=epic.pk, depends_on=[first.pk])
    Spend.objects.create(day=timezone.localdate(), scope="executing", goal_id=goal["id"], usd=2)

    shown = as_json("goals", "show", str(goal["id"]))

    assert [(q["id"], q["waits_on"]) for q in shown["quanta"]] == [
        (first.pk, []),
        (second.pk, [first.pk]),
    ]
    assert shown["quanta_total"] == 2 and Decimal(shown["spend_usd"]) == 2
    assert f"#{first.pk}" in run("goals", "show", str(goal["id"]))


def test_goals_approve_and_abandon(db: Any) -> None:
    goal, other = add(), add("Other")

    approved = as_json("goals", "approve", str(goal["id"]))
    assert approved["status"] == GoalStatus.APPROVED
    abandoned = as_json("goals", "abandon", str(other["id"]), "--reason", "not now")
    assert (abandoned["status"], abandoned["reason"]) == (GoalStatus.ABANDONED, "not now")
    assert "abandoned" in run("goals", "abandon", str(goal["id"]))
    with pytest.raises(CommandError, match="cannot move goal"):
        run("goals", "approve", str(other["id"]))
    assert GoalTransition.objects.filter(goal_id=other["id"]).count() == 2


def test_goals_refuse_unknown_ids_and_bad_fields(db: Any) -> None:
    for args in (("show", "999"), ("approve", "999"), ("abandon", "999")):
        with pytest.raises(CommandError, match="no goal #999"):
            run("goals", *args)
    with pytest.raises(CommandError, match="'rm -rf /' is refused by the command guard"):
        add("Dangerous", "--verify", "rm -rf /")
    assert not Goal.objects.exists()


# --- autopilot --------------------------------------------------------------------------------


def test_autopilot_status_of_a_fresh_installation(db: Any) -> None:
    status = as_json("autopilot", "status")

    assert (status["state"], status["paused"], status["forced"]) == ("resting", True, False)
    assert status["cap"]["reached"] is False
    assert set(status["spend_today"]) == {
        "executing", "improving", "contemplating", "resting", "healing", "operator",
    }  # fmt: skip
    assert Decimal(status["spend_today"]["improving"]["budget_usd"]) == Decimal(
        str(settings.AUTOPILOT_BUDGET_STATE_USD["improving"])
    )
    assert status["spend_today"]["resting"]["budget_usd"] is None
    text = run("autopilot", "status")
    assert "state:   resting (paused)" in text and "spend today:" in text


def test_autopilot_pause_resume_force_history(db: Any, settings: Any) -> None:
    resumed = as_json("autopilot", "resume")
    assert resumed["paused"] is False
    forced = as_json("autopilot", "force", "improving")
    assert (forced["state"], forced["forced"]) == ("improving", True)
    assert "paused" in run("autopilot", "pause", "--reason", "lunch")
    hub = Hub.objects.get()
    assert hub.paused and "lunch" in hub.paused_reason

    history = as_json("autopilot", "history")
    assert len(history) == HubTransition.objects.count() >= 3
    assert history[0]["id"] == HubTransition.objects.latest("created_at", "id").pk
    assert len(as_json("autopilot", "history", "--limit", "1")) == 1
    assert "improving" in run("autopilot", "history")


def test_autopilot_status_says_when_the_cap_is_reached(db: Any, settings: Any) -> None:
    settings.SPEND_CAP_DAY_USD = 1.0
    Spend.objects.create(day=timezone.localdate(), scope="operator", usd="1.5")

    status = as_json("autopilot", "status")

    assert status["cap"]["reached"] is True and Decimal(status["cap"]["cap_usd"]) == 1
    assert "spend cap reached: agents paused" in run("autopilot", "status")


def test_they_exit_2_on_bad_usage(db: Any) -> None:
    def status(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=Path(settings.BASE_DIR),
            capture_output=True,
            check=False,
            text=True,
        )
        return done.returncode, done.stderr

    for args in (
        ("goals", "add", "--title", "x"),  # --criteria is required
        ("goals", "add", "--title", "x", "--criteria", "y", "--priority", "7"),
        ("goals", "add", "--title", "x", "--criteria", "y", "--budget", "-1"),
        ("goals", "add", "--title", "x", "--criteria", "y", "--budget", "nan"),
        ("goals", "list", "--status", "dreaming"),
        ("goals", "show", "abc"),
        ("autopilot", "force", "dreaming"),
        ("autopilot", "history", "--limit", "0"),
        ("autopilot", "frobnicate"),
    ):
        code, err = status(*args)
        assert code == 2, args
        assert len(err.strip().splitlines()) == 1, (args, err)
