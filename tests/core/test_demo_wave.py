"""`manage.py demo` as an operator runs it: the wave, then the autopilot pass, on the test
database, with the worker the command starts for itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from autopilot.models import Goal, GoalStatus, Hub, HubState, HubTransition
from bursts.models import Wave
from quanta.models import Quantum
from reflection.models import PlaybookRule, RuleUse

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")
def test_the_demo_runs_two_waves_that_learn_then_an_autopilot_pass_that_ends_resting(
    tmp_path: Path,
) -> None:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "ANNIHILATION_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("ANNIHILATION_PROVIDER", None)
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("ANNIHILATION_REPO", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--timeout", "240"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]

    # The learning loop: the first wave's failed reviews taught the coders a rule, which was in
    # the prompts of the second wave's coders, and the second wave failed fewer stages.
    assert "reflector: scripted, a scripted stand-in for a model" in out
    first, second = Wave.objects.order_by("pk")[:2]
    failed = re.search(rf"Failed stages: wave {first.pk}: (\d+); wave {second.pk}: (\d+)", out)
    assert failed is not None, out[-3000:]
    assert int(failed[1]) >= 2 and int(failed[2]) == 0
    lesson = PlaybookRule.objects.get(text__startswith="Run the tests before handing over")
    assert lesson.roles == ["coder"] and lesson.evidence_agent_run_ids and lesson.evidence_event_ids
    assert f"rule {lesson.pk} [rule, candidate" in out
    given = RuleUse.objects.filter(rule=lesson, agent_run__quantum_run__wave=second)
    assert sorted(given.values_list("agent_run__role", "outcome")) == [
        ("coder", "success"),
        ("coder", "success"),
    ]
    reruns = Quantum.objects.filter(labels__contains=["needs-tests"])
    assert [q.status for q in reruns] == ["closed", "closed"]

    goal = Goal.objects.get(labels__contains=["demo-goal"])
    assert goal.status == GoalStatus.DONE, goal.reason
    assert f"goal {goal.pk}: verifying -> done: verified on main" in out
    children = Quantum.objects.filter(parent_id=goal.epic_id)
    assert children.count() == 2
    assert all(q.status == "closed" for q in children)
    # The hub went to work, then improved, then rested; each change is printed with its reason.
    states = list(
        HubTransition.objects.filter(by="tick").order_by("pk").values_list("to_state", flat=True)
    )
    assert states[0] == HubState.EXECUTING
    assert HubState.IMPROVING in states
    assert states[-1] == HubState.RESTING
    assert "-> improving (tick): nothing to execute and a scan is due" in out
    # The scanner found the demo repository's TODO and filed a quantum, which was done and merged.
    filed = Quantum.objects.get(labels__contains=["scan:todo"])
    assert f"filed as #{filed.pk} [closed]" in out
    calc = subprocess.run(
        ["git", "show", "main:calc.py"],
        cwd=tmp_path / "home" / "repo",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "def divide" in calc and "TODO" not in calc
    hub = Hub.objects.get()
    assert hub.paused and hub.state == HubState.RESTING
