"""The shell-only executor: a trivial quantum's mechanical steps run without a model, through the
runtime's normal tool path (command guard, sandbox, recorded tool calls, commit, verification).

In process on a real repository, and a whole pipeline wave (planner, coder with verification,
tester with a verdict) on a real Celery worker."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bursts.models import AgentRun, QuantumRun, RunStatus, WaveStatus
from bursts.services import wave_start
from psychonauts.models import CommandTrauma, ToolCall, Usage, Verification
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.pipelines.services import pipelines_save
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, fast_settings, make_worker, step_log, wait_wave
from tests.psychonauts.stages import staged_run

__all__ = ["fast_settings", "make_worker", "step_log"]  # the real workers' fixtures

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

BUMP = "Steps:\n$ printf '1.1\\n' > VERSION\n$ cat VERSION"


def _bump(make_quantum, **fields):
    quantum = make_quantum("Bump the version", body=BUMP, **fields)
    assert quantum.complexity == "trivial"
    return quantum


def _branch_has(repo: Path, quantum_id: int, path: str) -> bool:
    try:
        git("cat-file", "-e", f"{branch_for(quantum_id)}:{path}", cwd=repo)
    except Exception:
        return False
    return True


def test_a_refused_step_fails_the_run_and_nothing_is_committed(repo: Path, make_quantum, make_run):
    quantum = make_quantum(
        "Clean up", body="$ printf 'x\\n' > done.txt\n$ rm -rf / --no-preserve-root"
    )
    assert (quantum.complexity, quantum.complexity_auto) == ("trivial", True)
    run = make_run("coder", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "1 of 2 mechanical step(s) failed" in outcome.error
    assert "rm -rf /" in outcome.error and "refused" in outcome.error
    refused = ToolCall.objects.get(agent_run=run, input__command__startswith="rm")
    assert refused.is_error and refused.output.startswith("shell refused")
    assert CommandTrauma.objects.filter(source="guard").exists()
    assert not _branch_has(repo, quantum.pk, "done.txt")


def test_a_step_that_exits_non_zero_fails_the_run_with_its_output(
    repo: Path, make_quantum, make_run
):
    quantum = make_quantum("Bump the version", body="$ printf 'nope\\n' && false\n$ true")
    run = make_run("coder", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "1 of 2 mechanical step(s) failed" in outcome.error
    assert "exit 1" in outcome.error and "nope" in outcome.error
    assert list(Usage.objects.filter(agent_run=run).values_list("tokens_in", "tokens_out")) == [
        (0, 0)
    ]


def test_a_verify_stage_checks_the_steps_and_a_failed_check_ends_the_run_at_once(
    repo: Path, make_quantum
):
    quantum = _bump(make_quantum, verify_commands=["grep -qx 2.0 VERSION"])
    run = staged_run(quantum, "coder", verify=True, verify_retries=2)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "cannot correct" in outcome.error and "grep -qx 2.0 VERSION" in outcome.error
    # One round: the same steps again could not pass where they failed.
    assert list(Verification.objects.filter(agent_run=run).values_list("round", "passed")) == [
        (1, False)
    ]


def test_a_verify_stage_passes_when_the_checks_pass(repo: Path, make_quantum):
    quantum = _bump(make_quantum, verify_commands=["grep -qx 1.1 VERSION"])
    run = staged_run(quantum, "coder", verify=True)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert "Verified: 1 check(s) passed." in outcome.result
    assert git("show", f"{branch_for(quantum.pk)}:VERSION", cwd=repo).strip() == "1.1"


@pytest.mark.parametrize(
    ("checks", "status", "said"),
    [
        pytest.param(["grep -qx 1.1 VERSION"], "done", "all 1 verify command(s) passed", id="pass"),
        pytest.param(["test -f MISSING"], "error", "verify commands failed", id="fail"),
        pytest.param([], "done", "no checks given; the mechanical steps ran", id="no-checks"),
    ],
)
def test_a_reviewer_gives_a_mechanical_verdict_from_the_verify_commands(
    repo: Path, make_quantum, make_run, checks, status, said
):
    quantum = _bump(make_quantum, verify_commands=checks)
    assert agent_run_execute(agent_run_id=make_run("coder", quantum=quantum).pk).status == "done"
    review = make_run("reviewer", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=review.pk)

    assert outcome.status == status, outcome.error
    assert said in outcome.result
    checks_run = ToolCall.objects.filter(agent_run=review, tool_use_id__startswith="shell_check_")
    assert [c.input["command"] for c in checks_run] == checks
    assert ToolCall.objects.filter(agent_run=review, name="report_verdict").count() == 1


def test_a_reviewer_without_checks_fails_when_no_run_of_the_steps_is_found(
    repo: Path, make_quantum, make_run
):
    review = make_run("reviewer", quantum=_bump(make_quantum))

    outcome = agent_run_execute(agent_run_id=review.pk)

    assert outcome.status == "error"
    assert "no checks given, and no run of the mechanical steps was found" in outcome.result


def test_a_read_only_role_ends_at_once_with_the_steps(repo: Path, make_quantum, make_run):
    run = make_run("planner", quantum=_bump(make_quantum))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert "1. printf '1.1\\n' > VERSION" in outcome.result and "2. cat VERSION" in outcome.result
    assert not ToolCall.objects.filter(agent_run=run).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_wave_runs_a_trivial_mechanical_quantum_through_its_pipeline_without_a_model(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    make_worker(
        "shell",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SANDBOX="on",
        # Every role on the real provider, pointed at nothing: a model call would fail the run.
        ANNIHILATION_PROVIDER="anthropic",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9",
        ANTHROPIC_API_KEY="not-used",
        ANNIHILATION_PROVIDER_RETRIES="1",
    )
    stage: dict[str, Any] = {"condition": "", "retries": 0, "timeout_s": 0, "mode": "sequential"}
    spec: Any = {
        "name": "mechanical",
        "description": "",
        "match_labels": [],
        "match_kinds": [],
        "is_default": True,
        "stages": [
            {**stage, "index": 0, "name": "plan", "agents": [{"role": "planner", "settings": {}}]},
            {**stage, "index": 1, "name": "implement", "verify": True,
             "agents": [{"role": "coder", "settings": {}}]},
            {**stage, "index": 2, "name": "test", "agents": [{"role": "tester", "settings": {}}]},
        ],
    }  # fmt: skip
    pipelines_save(specs=[("test", spec)])
    quantum = quantum_create(
        title="Bump the version", body=BUMP, verify_commands=["grep -qx 1.1 VERSION"]
    )
    assert (quantum.complexity, quantum.complexity_auto) == ("trivial", True)

    wave = wait_wave(wave_start().pk, timeout=90)

    assert wave.status == WaveStatus.DONE
    assert QuantumRun.objects.get(quantum=quantum).status == RunStatus.DONE
    runs = {r.role: r for r in AgentRun.objects.filter(quantum=quantum)}
    assert {role: (r.status, r.provider, r.model) for role, r in runs.items()} == {
        "planner": ("done", "shell", "shell"),
        "coder": ("done", "shell", "shell"),
        "tester": ("done", "shell", "shell"),
    }
    # The steps' effect is committed on the quantum's branch.
    assert git("show", f"{branch_for(quantum.pk)}:VERSION", cwd=repo).strip() == "1.1"
    steps = ToolCall.objects.filter(agent_run=runs["coder"], name="shell").order_by("id")
    assert [c.input["command"] for c in steps] == ["printf '1.1\\n' > VERSION", "cat VERSION"]
    # The verify commands ran: by the runtime after the coder, and as the tester's checks.
    assert Verification.objects.get(agent_run=runs["coder"]).passed
    checks = ToolCall.objects.filter(agent_run=runs["tester"], name="shell")
    assert [c.input["command"] for c in checks] == ["grep -qx 1.1 VERSION"]
    assert "VERDICT: PASS" in runs["tester"].result
    # No model was called: every turn is the shell provider's, at no cost.
    usage = set(Usage.objects.filter(agent_run__quantum=quantum).values_list("provider", "model"))
    assert usage == {("shell", "shell")}
    assert sum(u.cost_usd for u in Usage.objects.filter(agent_run__quantum=quantum)) == 0


def test_a_role_with_every_tool_runs_the_steps(repo: Path, make_quantum, make_run):
    from psychonauts.models import Role

    Role.objects.create(name="generalist", system_prompt="Do it.", allowed_tools=[])
    quantum = _bump(make_quantum)
    run = make_run("generalist", quantum=quantum)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert git("show", f"{branch_for(quantum.pk)}:VERSION", cwd=repo).strip() == "1.1"
