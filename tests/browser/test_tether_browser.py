"""The Tether and Grounding pages in Chromium, against daphne and a real worker: an agent asks,
the question appears live, the operator answers it in place and the agent goes on; a drift is
rejected into a correction quantum; the change the agent made is approved and merged."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from bursts.models import Wave
from bursts.services import wave_start
from core.access import operator_ensure
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.runs import agent_run_create
from quanta.models import Quantum
from quanta.services import quantum_create
from tests.bursts.conftest import pipeline
from tests.polling import wait_for
from tests.tether.conftest import SOLO_WITH_TESTER
from tether.models import ChangeReview, ChangeStatus, Drift, DriftStatus, Reaching
from tether.services import mutation_propose, reaching_ask, reaching_expire

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT_EVENTS = """
window.__liveEvents = 0;
document.addEventListener("annihilation:event", () => { window.__liveEvents += 1; });
"""


def a_drift(quantum: Quantum) -> Drift:
    """A question nobody answered in time (its agent run is not executing: nobody resumes)."""
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    reaching = reaching_ask(
        agent_run_id=run.pk,
        quantum_id=quantum.pk,
        tool_use_id="toolu_drift",
        question="Store dates in UTC?",
        assumption="store dates in UTC",
        timeout_s=1,
    )
    assert reaching_expire(reaching_id=reaching.pk, now=timezone.now() + timedelta(seconds=5))
    return Drift.objects.get(reaching=reaching)


def test_an_operator_answers_rejects_and_approves(control_room, page, login, screenshot):
    roles_sync_defaults()
    operator_ensure(username="operator", password="correct horse")
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])
    # `ask` selects psychonauts/scripts/tether.yaml: the coder asks the Tether, then writes a note.
    quantum = quantum_create(title="Keep the old API or not", labels=["solo", "ask"])

    login(control_room, "operator", "correct horse")
    page.add_init_script(COUNT_EVENTS)
    page.click("#nav-tether")
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")

    # The question appears without a reload, with its countdown running.
    wave = wave_start(labels=["solo"])
    card = page.locator(".reaching").first
    expect(card).to_contain_text(f"Should quantum {quantum.pk} keep the old API?", timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True
    reaching = Reaching.objects.get(quantum=quantum, status="pending")
    expect(page.locator("#count-reachings")).to_have_text("1")
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^4m \d+s left$"))
    screenshot("tether")

    page.click(f"#answer-{reaching.pk}")  # empty: an error next to the field, nothing sent
    expect(page.locator(f"#answer-form-{reaching.pk} .errorlist")).to_have_text("Write an answer.")
    page.fill(f"#id_answer{reaching.pk}_text", "keep it, callers depend on it")
    page.click(f"#answer-{reaching.pk}")
    expect(page.locator(".messages .success")).to_contain_text(
        f"Answered reaching #{reaching.pk}; the agent resumes with it."
    )
    expect(page.locator(f"#reaching-{reaching.pk}")).to_have_count(0)

    # The agent goes on with the answer; its run ends and its change waits for review.
    wait_for(lambda: Wave.objects.get(pk=wave.pk).status == "done", 60, what="the wave")
    change = wait_for(
        lambda: ChangeReview.objects.filter(quantum=quantum).first(), 60, what="the change review"
    )

    # A drift arrives live; rejecting it needs a reason and files a correction quantum.
    page.evaluate("window.__sameDocument = true")
    drift = a_drift(quantum_create(title="Audit timestamps"))
    expect(page.locator(f"#drift-{drift.pk}")).to_contain_text("store dates in UTC")
    assert page.evaluate("window.__sameDocument") is True
    page.click(f"#reject-{drift.pk}")
    expect(page.locator(f"#drift-{drift.pk} .errorlist")).to_have_text(
        "Say why the assumption is wrong."
    )
    page.fill(f"#id_reject{drift.pk}_reason", "dates are local to the shop")
    page.click(f"#reject-{drift.pk}")
    expect(page.locator(".messages .success")).to_contain_text("correction quantum")
    drift.refresh_from_db()
    assert drift.status == DriftStatus.REJECTED and drift.correction_id
    screenshot("tether-drift-rejected")
    page.click(f"#drift-{drift.pk}-correction")
    expect(page.locator("h1")).to_contain_text(f"#{drift.correction_id}")
    expect(page.locator("#quantum-state")).to_contain_text("correction")
    screenshot("correction-quantum")

    # The change: listed with its risk, read per file, approved and merged.
    mutation_propose(pipeline="solo", text=SOLO_WITH_TESTER, rationale="a tester should check")
    page.click("#nav-grounding")
    expect(page.locator(f"#change-{change.pk}")).to_contain_text(change.risk)
    expect(page.locator(".mutation .side pre").nth(1)).to_contain_text("tester")
    screenshot("grounding")
    page.click(f"#change-{change.pk} a >> nth=0")
    expect(page.locator("#diff")).to_contain_text(f"notes/decision-q{quantum.pk}.md")
    expect(page.locator("#diff .add").first).to_be_visible()
    screenshot("change")
    page.click("#change-approve")
    expect(page.locator(".messages .success")).to_contain_text("merged into main")
    wait_for(  # the worker's merge queue merges it
        lambda: ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.MERGED,
        what="the merge queue",
    )
    page.reload()
    expect(page.locator("#change-status")).to_have_text("merged")
    assert ChangeReview.objects.get(pk=change.pk).status == ChangeStatus.MERGED
    page.goto(f"{control_room}/quanta/{quantum.pk}/")
    expect(page.locator("#quantum-changes")).to_contain_text("merged")
    page.goto(f"{control_room}/")
    expect(page.locator("#count-changes")).to_have_text("0")
    screenshot("dashboard-tether-counters")
