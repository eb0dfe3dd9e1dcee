"""Verification that decides: a `verify` stage's final answer is checked by the quantum's verify
commands; failures go back to the same agent (build-verify-fix) until its retries are spent."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse

from bursts.models import AgentRun
from core.access import operator_ensure
from core.events import event_message
from core.live import fragment_render
from core.models import Event
from psychonauts.models import AgentTurn, Verification
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server
from tests.psychonauts.stages import staged_run

pytestmark = pytest.mark.django_db

CHECKS = ["test -f calc.py", "grep -q fixed status.txt"]


@pytest.fixture
def fake_env(monkeypatch, settings):
    def point(base_url: str) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    return point


def _head(repo: Path, run: AgentRun) -> str:
    """The tip of the quantum's branch."""
    return git("rev-parse", branch_for(run.quantum_id), cwd=repo).strip()


def test_a_fix_that_fails_verification_passes_after_the_feedback(repo, make_quantum, fake_env):
    quantum = make_quantum(verify_commands=CHECKS)
    run = staged_run(quantum, "coder", provider="anthropic", verify=True, verify_retries=2)
    replies = [
        FakeReply(tool_uses=[("write_file", {"path": "status.txt", "content": "broken\n"})]),
        FakeReply(text="Done."),
        FakeReply(tool_uses=[("write_file", {"path": "status.txt", "content": "fixed\n"})]),
        FakeReply(text="Fixed it."),
    ]
    with fake_anthropic_server(replies) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert "Verified: 2 check(s) passed." in outcome.result
    # The third request continues the conversation with the corrective message.
    corrective = fake.requests[2]["messages"][-1]
    assert corrective["role"] == "user"
    text = corrective["content"][0]["text"]
    assert "Verification failed (round 1)" in text
    assert "- PASSED: `test -f calc.py`" in text
    assert "- FAILED: `grep -q fixed status.txt` (exit status 1)" in text
    rounds = list(Verification.objects.filter(agent_run=run).order_by("round"))
    assert [(v.round, v.passed) for v in rounds] == [(1, False), (2, True)]
    assert rounds[1].commit_sha == _head(repo, run)
    assert rounds[0].commit_sha != rounds[1].commit_sha
    assert [c["passed"] for c in rounds[0].checks] == [True, False]
    # Stored with the checkpoint: a resumed run sends the same conversation.
    final = AgentTurn.objects.get(agent_run=run, index=1)
    assert final.tool_results == [{"type": "text", "text": text}]
    live = Event.objects.filter(topic="quanta", type="verification").order_by("id")
    assert [(e.payload["round"], e.payload["then"]) for e in live] == [(1, "retry"), (2, "done")]
    assert Event.objects.filter(topic=f"agent:{run.agent_id}", type="verification").count() == 2


def test_it_fails_the_run_when_verification_still_fails_after_its_retries(
    repo, make_quantum, scripts
):
    scripts(
        "stubborn",
        'name: stubborn\nmatch: {labels: [stubborn]}\nturns:\n  - text: "Done."\n'
        '  - text: "Still done."\n',
    )
    quantum = make_quantum(verify_commands=CHECKS, labels=["stubborn"])
    run = staged_run(quantum, "coder", verify=True, verify_retries=1)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("verification failed after 2 round(s)")
    assert "- PASSED: `test -f calc.py`" in outcome.error
    assert "- FAILED: `grep -q fixed status.txt`" in outcome.error
    assert Verification.objects.filter(agent_run=run, passed=False).count() == 2


def test_a_hanging_verify_command_is_killed_at_its_timeout_and_fails_the_run(
    repo, make_quantum, scripts, settings
):
    settings.VERIFY_TIMEOUT_S = 1
    scripts("quick", 'name: quick\nmatch: {labels: [quick]}\nturns:\n  - text: "Done."\n')
    quantum = make_quantum(verify_commands=["sleep 60"], labels=["quick"])
    run = staged_run(quantum, "coder", verify=True, verify_retries=0)

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "- FAILED: `sleep 60` (timed out after 1s)" in outcome.error
    verification = Verification.objects.get(agent_run=run)
    assert verification.checks[0]["reason"] == "timed out after 1s"
    assert verification.checks[0]["elapsed_s"] < 10


def test_it_verifies_nothing_outside_a_verify_stage(repo, make_quantum, make_run):
    quantum = make_quantum(verify_commands=["false"])

    outcome = agent_run_execute(agent_run_id=make_run("coder", quantum=quantum).pk)

    assert outcome.status == "done", outcome.error
    assert not Verification.objects.exists()


def test_the_quantum_page_and_focus_show_the_rounds_and_redraw_them_live(
    repo, make_quantum, scripts, client
):
    scripts(
        "stubborn",
        'name: stubborn\nmatch: {labels: [stubborn]}\nturns:\n  - text: "Done."\n',
    )
    quantum = make_quantum(verify_commands=CHECKS, labels=["stubborn"])
    run = staged_run(quantum, "coder", verify=True, verify_retries=0)
    agent_run_execute(agent_run_id=run.pk)
    verification = Verification.objects.get(agent_run=run)
    client.force_login(operator_ensure(username="op", password="pw-operator"))

    for page in (
        client.get(reverse("quantum", args=[quantum.pk])),
        client.get(reverse("focus", args=[run.pk])),
    ):
        html = page.content.decode()
        assert f'id="verification-{verification.pk}"' in html
        # grep: status 2, the file is missing
        assert (
            '<span class="pill s-error">exit status 2</span> <code>grep -q fixed status.txt</code>'
            in html
        )
        assert verification.commit_sha[:10] in html

    for topic, page, params in (
        ("quanta", "quantum", {"quantum_id": str(quantum.pk)}),
        (f"agent:{run.agent_id}", "focus", {"agent_run_id": str(run.pk)}),
    ):
        event = Event.objects.get(topic=topic, type="verification")
        html = fragment_render(event_message(event), page=page, params=params, can_operate=False)
        assert '<div id="verifications" data-swap="replace">' in html
        assert f'id="verification-{verification.pk}"' in html


def test_focus_shows_a_reviewers_verdict(repo, make_run, client):
    run = make_run("reviewer")
    agent_run_execute(agent_run_id=run.pk)
    client.force_login(operator_ensure(username="op", password="pw-operator"))

    html = client.get(reverse("focus", args=[run.pk])).content.decode()

    assert '<span class="pill s-done">verdict: pass</span>' in html
    event = Event.objects.get(topic=f"agent:{run.agent_id}", type="verdict")
    fragment = fragment_render(
        event_message(event), page="focus", params={"agent_run_id": str(run.pk)}, can_operate=False
    )
    assert '<div id="verdict" data-swap="replace">' in fragment
