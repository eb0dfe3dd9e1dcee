"""The seam between the burst manager and the agent runtime (bursts.executor): one executor,
registered; noop as a bench switch; nothing named in a setting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bursts.executor import EXECUTOR, Executor, Outcome, execute_agent
from core.hooks import HookEmpty
from psychonauts.runtime.entry import agent_run

ROOT = Path(__file__).resolve().parents[2]


def answers(*, agent_run_id: int) -> Outcome:
    return Outcome("done", result=f"answered {agent_run_id}")


def breaks(*, agent_run_id: int) -> Outcome:
    raise RuntimeError("the runtime fell over")


def test_it_runs_the_executor_the_runtime_registered() -> None:
    assert EXECUTOR.one() is agent_run


def test_it_runs_an_installed_executor_and_turns_its_exception_into_an_error(
    executor: Callable[[Executor], Executor],
) -> None:
    executor(answers)
    assert execute_agent(7) == Outcome("done", result="answered 7")

    executor(breaks)
    assert execute_agent(7) == Outcome("error", error="RuntimeError: the runtime fell over")


def test_noop_finishes_every_agent_at_once(
    executor: Callable[[Executor], Executor], settings: Any
) -> None:
    executor(breaks)
    settings.BURSTS_EXECUTOR = "noop"

    assert execute_agent(3) == Outcome("done", result="noop agent run 3")


def test_it_says_so_when_no_executor_is_registered() -> None:
    with EXECUTOR.replaced(), pytest.raises(HookEmpty, match=r"bursts\.executor"):
        execute_agent(1)


def test_it_refuses_an_executor_setting_it_does_not_know() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "annihilation.settings",
            "ANNIHILATION_BURSTS_EXECUTOR": "tests.bursts.executors.scripted",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "ANNIHILATION_BURSTS_EXECUTOR='tests.bursts.executors.scripted'" in result.stderr
    assert "expected psychonauts or noop" in result.stderr
