"""The Goals page and the autopilot card in Chromium, against daphne and a real worker: an
operator proposes a goal (a bad form first: the errors show and nothing typed is lost), approves
it and sees its status; a goal contemplation proposes appears live, marked as waiting; on the dashboard the card is paused, resumed and paused again, and a
state forced from outside redraws the card live, without a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from autopilot.models import Goal, GoalSource, GoalStatus, Hub
from autopilot.services.goals.lifecycle import goal_create
from autopilot.services.hub import hub_force
from core.access import operator_ensure

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT_EVENTS = """
window.__liveEvents = 0;
document.addEventListener("annihilation:event", () => { window.__liveEvents += 1; });
"""


def test_an_operator_proposes_approves_and_steers_the_autopilot(
    control_room, page, login, screenshot
):
    operator_ensure(username="operator", password="correct horse")
    login(control_room, "operator", "correct horse")

    # A goal: the form refuses what is missing and keeps what was typed.
    page.click("#nav-goals")
    expect(page.locator("#no-goals")).to_be_visible()
    page.fill("#id_title", "Dark mode")
    page.fill("#id_verify_commands", "pytest -q\nrm -rf /")
    page.fill("#id_labels", "ui")
    page.click("#goal-create")
    expect(page.locator("#field-success_criteria .errorlist")).to_contain_text(
        "Say what must be true when the goal is done."
    )
    expect(page.locator("#field-verify_commands .errorlist")).to_contain_text(
        "is refused by the command guard"
    )
    expect(page.locator("#id_title")).to_have_value("Dark mode")
    expect(page.locator("#id_labels")).to_have_value("ui")
    assert not Goal.objects.exists()
    screenshot("goals-form-errors")

    page.fill("#id_success_criteria", "every page has a dark theme")
    page.fill("#id_verify_commands", "pytest -q")
    page.fill("#id_budget_usd", "5")
    page.click("#goal-create")
    expect(page.locator("#goal-status")).to_be_visible()
    goal = Goal.objects.get()
    expect(page).to_have_url(re.compile(rf"/goals/{goal.pk}/$"))
    expect(page.locator("#goal-status")).to_have_text("proposed")
    expect(page.locator("#goal-waiting")).to_have_text("waiting for approval")

    page.click("#goal-approve")
    expect(page.locator(".messages .success")).to_contain_text(f"Goal #{goal.pk} approved")
    expect(page.locator("#goal-status")).to_have_text("approved")
    goal.refresh_from_db()
    assert (goal.status, goal.approved_by) == (GoalStatus.APPROVED, "operator")
    expect(page.locator("#goal-history")).to_contain_text("approved by operator")
    screenshot("goal")
    page.click("#nav-goals")
    expect(page.locator(f"#goal-status-{goal.pk}")).to_have_text("approved")

    # A goal contemplation proposes appears live, marked as waiting for the operator.
    expect(page.locator("#live-status")).to_have_text("live")
    idea = goal_create(
        title="Cache the ready set",
        success_criteria="ready query p95 under 2 ms",
        source=GoalSource.CONTEMPLATION,
        by="contemplation",
    )
    row = page.locator(f"#goal-row-{idea.pk}")
    expect(row).to_contain_text("waiting for approval", timeout=15_000)
    expect(row).to_contain_text("contemplation")
    screenshot("goals")

    # The card: a fresh autopilot is paused; resume, then pause with a reason.
    page.add_init_script(COUNT_EVENTS)
    page.click("text=Dashboard")
    expect(page.locator("#autopilot-paused")).to_be_visible()
    page.click("#autopilot-resume")
    expect(page.locator(".messages .success")).to_contain_text("Autopilot resumed")
    expect(page.locator("#autopilot-paused")).to_have_count(0)
    assert Hub.objects.get().paused is False
    page.fill("#autopilot-pause-reason", "lunch break")
    page.click("#autopilot-pause")
    expect(page.locator("#autopilot-paused")).to_be_visible()
    expect(page.locator("#autopilot-paused-reason")).to_contain_text("lunch break")
    assert Hub.objects.get().paused is True

    # Forced from the CLI's side: the card redraws over the socket, the page is not reloaded.
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("window.__sameDocument = true")
    hub_force(state="improving", by="test")
    expect(page.locator("#autopilot-state")).to_have_text("improving", timeout=15_000)
    expect(page.locator("#autopilot-forced")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True
    assert page.evaluate("window.__liveEvents") > 0
    screenshot("dashboard-autopilot")

    # A form redrawn by a fragment still posts (it borrows the page's CSRF token).
    page.click("#autopilot-resume")
    expect(page.locator(".messages .success")).to_contain_text("Autopilot resumed")
    expect(page.locator("#autopilot-forced")).to_have_count(0)
    page.click("#nav-autopilot")
    expect(page.locator("#hub-transitions")).to_contain_text("lunch break")
    expect(page.locator("#live-status")).to_have_text("live")
    hub_force(state="healing", by="test")  # the history's first page grows live
    expect(page.locator("#hub-transitions tr").nth(1)).to_contain_text(
        "forced to healing by test", timeout=15_000
    )
    expect(page.locator("#autopilot-state")).to_have_text("healing")
    screenshot("autopilot-history")
    page.click("#autopilot-pause")  # leave it paused: the worker's beat ticks no further
    expect(page.locator("#autopilot-paused")).to_be_visible()
