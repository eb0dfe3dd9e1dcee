"""The Focus page of a fast agent, opened as it starts: nothing of its stream is lost (events
written before the socket subscribed included), and the header (status, turn, cost) and the
side panels (tool calls, diary, diff) follow it without a reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from bursts.models import AgentRun
from core.access import operator_ensure
from core.models import Event
from psychonauts.models import ToolCall
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.runs import agent_run_create
from psychonauts.tasks import execute_agent_run
from quanta.services import quantum_create
from tests.polling import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Counts live messages from the first script on: proves the page changed without a reload.
COUNT_EVENTS = """
window.__liveEvents = 0;
document.addEventListener("annihilation:event", () => { window.__liveEvents += 1; });
"""


@pytest.mark.parametrize("attempt", range(4))
def test_the_focus_page_of_a_fast_agent_loses_nothing_and_stays_live(
    control_room, page, login, attempt
):
    roles_sync_defaults()
    operator_ensure(username="operator", password="correct horse")
    login(control_room, "operator", "correct horse")
    page.add_init_script(COUNT_EVENTS)
    quantum = quantum_create(title=f"Focus on a fast agent {attempt}")
    run = agent_run_create(quantum_id=quantum.pk, role="coder")

    execute_agent_run.delay(run.pk)  # it starts as the page loads
    page.goto(f"{control_room}/agents/{run.pk}/")

    wait_for(lambda: AgentRun.objects.get(pk=run.pk).status in ("done", "error"), timeout=60)
    done = AgentRun.objects.get(pk=run.pk)
    assert done.status == "done", done.error
    expect(page.locator("#agent-status")).to_have_text("done", timeout=15_000)
    ids = list(
        Event.objects.filter(topic=f"agent:{run.agent_id}", payload__agent_run_id=run.pk)
        .order_by("id")
        .values_list("id", flat=True)
    )
    assert len(ids) >= 5
    # The header may read the run as done before the last events reach the page: wait for them.
    expect(page.locator("#stream li[id^=st-]")).to_have_count(len(ids), timeout=15_000)
    shown = page.eval_on_selector_all("#stream li", "items => items.map(li => li.id)")
    assert [f"st-{i}" for i in ids] == [s for s in shown if s.startswith("st-")]
    # The header and the panels are the run's as it ended, not as the page was first drawn.
    expect(page.locator("#agent-turn")).to_have_text(str(done.turns.count()))
    expect(page.locator("#agent-tokens")).to_have_text(f"{done.tokens_in}/{done.tokens_out}")
    calls = ToolCall.objects.filter(agent_run_id=run.pk).count()
    assert calls >= 2
    expect(page.locator("#tool-calls tr")).to_have_count(calls + 1)
    expect(page.locator("#diary li")).to_contain_text(["Wrote notes/"])
    expect(page.locator("#diff")).to_contain_text(f"notes/q{quantum.pk}.md")
    assert page.evaluate("window.__liveEvents") >= 1
