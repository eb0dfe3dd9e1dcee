"""Loops stopped: scripted agents that repeat themselves end in error with the reason, before
their turns run out, and their quantum remembers what they repeated; an agent that retries a
flaky test until it passes is not stopped. Real runs of the scripted provider, real tools."""

from __future__ import annotations

import pytest

from psychonauts.models import AgentTurn, CommandTrauma, TraumaSource
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.prompt import agent_prompt

pytestmark = pytest.mark.django_db


def _script(name: str, turns: list[str]) -> str:
    body = "\n".join(f'  - text: "Turn."\n    tools:\n      - {t}' for t in turns)
    return f'name: {name}\nmatch: {{labels: [{name}]}}\nturns:\n{body}\n  - text: "Done."\n'


def test_an_agent_repeating_a_call_with_the_same_result_is_stopped(
    repo, make_quantum, make_run, scripts
):
    scripts("looper", _script("looper", ['read_file: {path: "missing.txt"}'] * 12))
    quantum = make_quantum(labels=["looper"])
    run = make_run("coder", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("loop: the same read_file call")
    assert "returned the same result 3 times" in outcome.error
    assert AgentTurn.objects.filter(agent_run=run).count() == 3
    trauma = CommandTrauma.objects.get(quantum_id=quantum.pk)
    assert trauma.source == TraumaSource.LOOP
    assert "missing" in trauma.pattern
    # The quantum's next agent is told; the guard's command patterns are not touched.
    retry = make_run("coder", quantum=quantum)
    assert "## Loops on this quantum" in agent_prompt(retry)
    assert "missing.txt" in agent_prompt(retry)
    assert not CommandTrauma.objects.filter(quantum_id__isnull=True).exists()


def test_an_agent_running_the_same_failing_command_is_stopped_whatever_each_run_took(
    repo, make_quantum, make_run, scripts
):
    """Each run of the command takes its own time; its output is the same."""
    command = 'shell: {command: "sleep 0.$RANDOM; echo FAILED test_x; exit 1"}'
    scripts("shell-looper", _script("shell-looper", [command] * 12))
    run = make_run("coder", quantum=make_quantum(labels=["shell-looper"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("loop: the same shell call"), outcome.error
    assert AgentTurn.objects.filter(agent_run=run).count() == 3


def test_an_agent_going_round_in_circles_is_stopped_for_no_progress(
    repo, make_quantum, make_run, scripts, settings
):
    settings.PSYCHONAUTS_LOOP_WINDOW = 3
    cycle = [f'list_dir: {{path: "{d}"}}' for d in (".", "src", "docs")]
    scripts("circles", _script("circles", cycle * 4))
    run = make_run("coder", quantum=make_quantum(labels=["circles"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("loop: no progress in 3 turns")
    assert AgentTurn.objects.filter(agent_run=run).count() == 6


def test_an_agent_retrying_a_flaky_test_twice_is_not_stopped(repo, make_quantum, make_run, scripts):
    """The test fails twice with the same output, then passes: the same call, but its result
    changed, so the agent goes on and finishes."""
    flaky = (
        "import pathlib, sys\\n"
        "p = pathlib.Path('.runs')\\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\\n"
        "p.write_text(str(n))\\n"
        "print('1 passed' if n >= 3 else 'FAILED test_flaky')\\n"
        "sys.exit(0 if n >= 3 else 1)\\n"
    )
    write = f'write_file: {{path: "test_flaky.py", content: "{flaky}"}}'
    run_it = 'shell: {command: "python3 test_flaky.py"}'
    scripts("flaky-test", _script("flaky-test", [write, run_it, run_it, run_it]))
    run = make_run("coder", quantum=make_quantum(labels=["flaky-test"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", [
        t.tool_results for t in AgentTurn.objects.filter(agent_run=run).order_by("index")
    ]
    results = [
        t.tool_results[0]["content"]
        for t in AgentTurn.objects.filter(agent_run=run).order_by("index")
        if t.tool_results and t.assistant[-1]["name"] == "shell"
    ]
    assert len(results) == 3
    # The same output both times (but how long each took): still not a loop, its result changed.
    assert results[0].partition("\n")[2] == results[1].partition("\n")[2]
    assert "FAILED" in results[0]
    assert "1 passed" in results[2]
    assert not CommandTrauma.objects.exists()
