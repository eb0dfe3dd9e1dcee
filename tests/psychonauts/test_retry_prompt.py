"""Retries that know why: a retried attempt's prompt, as the provider receives it, says why the
attempt before it failed and shows the quantum's latest comments; so does a later run's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services import run_step, slot_run, wave_advance
from bursts.services.waves import wave_start
from psychonauts.roles import roles_sync_defaults
from quanta.models import Quantum, QuantumStatus
from quanta.pipelines.services import pipelines_load
from quanta.services import comment_add, quantum_create
from tests.fakes.anthropic_server import FakeAnthropic, FakeReply, fake_anthropic_server

pytestmark = pytest.mark.django_db

PIPELINE = """\
name: retried
default: true
stages:
  - name: plan
    agents: [{role: planner, provider: anthropic}]
    retries: 1
"""
KEY = "sk-ant-api03-" + "Zq7" * 12


def prompt(request: dict[str, Any]) -> str:
    """The first user message: the prompt the agent starts from."""
    content = request["messages"][0]["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


@pytest.fixture
def provider(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[Callable[[list[bool]], FakeAnthropic]]:
    """A fake Messages API: each request fails (a bad request, not retried by the provider)
    or succeeds, in the order given; the requests it got are in `.requests`."""
    roles_sync_defaults()
    path = tmp_path / "retried.yaml"
    path.write_text(PIPELINE)
    pipelines_load(paths=[path], roles={"planner"})
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    servers = ExitStack()

    def start(outcomes: list[bool]) -> FakeAnthropic:
        replies = [
            FakeReply(text="Plan: done.") if ok else FakeReply(status=400, error="invalid_request_error")
            for ok in outcomes
        ]  # fmt: skip
        fake = servers.enter_context(fake_anthropic_server(replies))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        return fake

    with servers:
        yield start


def run_wave(quantum: Quantum) -> QuantumRun:
    """One wave's run of the quantum, its stage's slot run here (no worker), then stepped and
    drained as the chain's last link and the wave step would."""
    wave = wave_start()
    run = QuantumRun.objects.get(quantum=quantum, wave=wave)
    first = AgentRun.objects.get(quantum_run=run)
    slot_run(quantum_run_id=run.pk, stage_index=0, position=0, prior=None, agent_run_id=first.pk)
    run_step(quantum_run_id=run.pk, stage_index=0)
    wave_advance(wave_id=wave.pk)
    run.refresh_from_db()
    return run


def test_a_retried_attempt_is_told_why_the_last_one_failed_and_the_latest_comments(
    provider: Callable[[list[bool]], FakeAnthropic],
) -> None:
    fake = provider([False, True])
    quantum = quantum_create(title="Plan the login page")
    for n in range(1, 26):
        comment_add(quantum_id=quantum.pk, body=f"note number {n:02d}", author="ada")
    comment_add(quantum_id=quantum.pk, body=f"the key is {KEY}", author="bob")

    run = run_wave(quantum)

    assert run.status == RunStatus.DONE
    first, second = AgentRun.objects.filter(quantum_run=run).order_by("attempt")
    assert (first.status, second.status) == (AgentStatus.ERROR, AgentStatus.DONE)
    assert "invalid_request_error" in first.error
    before, after = prompt(fake.requests[0]), prompt(fake.requests[1])
    assert "Why the previous attempt failed" not in before and "note number" not in before
    assert "## Why the previous attempt failed" in after
    assert f"Attempt 1 of {first.agent_id} (quantum run {run.pk}) ended error" in after
    assert first.error.strip() in after
    # The latest 20 comments, oldest first; the secret in one of them redacted.
    assert "## Comments on the quantum (the latest 20, oldest first)" in after
    assert "note number 06" not in after
    shown = [after.index(f"note number {n:02d}") for n in range(7, 26)]
    assert shown == sorted(shown) and after.index("bob (operator)") > shown[-1]
    assert KEY not in after and "the key is sk-ant-" in after
    assert second.context in after


def test_the_next_run_after_a_failed_one_is_told_why_it_failed(
    provider: Callable[[list[bool]], FakeAnthropic],
) -> None:
    fake = provider([False, False, True])
    quantum = quantum_create(title="Plan the login page")

    failed = run_wave(quantum)
    assert failed.status == RunStatus.ERROR
    quantum.refresh_from_db()
    assert quantum.status == QuantumStatus.OPEN
    # The runtime keeps the whole reason (a verification's output, say): cut to head and tail.
    last = AgentRun.objects.filter(quantum_run=failed).order_by("attempt").last()
    assert last is not None
    middle = "x" * 20_000
    reason = f"FAILED: `pytest -q` (exit status 1)\n{middle}\n3 failed, {KEY} leaked, 9 passed"
    AgentRun.objects.filter(pk=last.pk).update(error=reason)

    retried = run_wave(quantum)

    assert retried.status == RunStatus.DONE
    [third] = AgentRun.objects.filter(quantum_run=retried)
    assert third.attempt == 3
    after = prompt(fake.requests[2])
    assert f"Attempt 2 of {third.agent_id} (quantum run {failed.pk}) ended error" in after
    assert "FAILED: `pytest -q` (exit status 1)" in after and "3 failed," in after
    assert "characters left out" in after and middle not in after and KEY not in after
    assert f"Run {failed.pk} failed in wave" in after  # the burst manager's comment
    assert len(after) < 12_000


def test_a_chain_s_later_link_in_the_next_run_is_told_too(
    provider: Callable[[list[bool]], FakeAnthropic], tmp_path: Path
) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "name: chain\nmatch: {labels: [chain]}\nstages:\n  - name: plan\n    agents:\n"
        "      - {role: planner, provider: anthropic}\n"
        "      - {role: planner, provider: anthropic}\n"
    )
    pipelines_load(paths=[path], roles={"planner"})
    # Run 1: the first link passes, the second fails. Run 2: both pass.
    fake = provider([True, False, True, True])
    quantum = quantum_create(title="Plan the login page", labels=["chain"])

    def run_chain() -> QuantumRun:
        wave = wave_start()
        run = QuantumRun.objects.get(quantum=quantum, wave=wave)
        ids = list(AgentRun.objects.filter(quantum_run=run).order_by("position"))
        prior = None
        for agent in ids:
            prior = slot_run(
                quantum_run_id=run.pk,
                stage_index=0,
                position=agent.position,
                prior=prior,
                agent_run_id=agent.pk,
            )
        run_step(quantum_run_id=run.pk, stage_index=0)
        wave_advance(wave_id=wave.pk)
        run.refresh_from_db()
        return run

    failed = run_chain()
    assert failed.status == RunStatus.ERROR
    link = AgentRun.objects.get(quantum_run=failed, position=1)
    assert run_chain().status == RunStatus.DONE
    first_link, second_link = prompt(fake.requests[2]), prompt(fake.requests[3])
    # The first link's previous attempt was done: no failure to explain, but the comments.
    assert "Why the previous attempt failed" not in first_link
    assert f"Run {failed.pk} failed in wave" in first_link
    assert f"Attempt 1 of {link.agent_id} (quantum run {failed.pk}) ended error" in second_link
    assert link.error.strip() in second_link
    assert "## Stage 0 Results" in second_link  # and what the first link did in this run
