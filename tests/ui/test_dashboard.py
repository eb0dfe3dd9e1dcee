"""The dashboard's figures: what it counts, how fresh, and its rows kept by what they show."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from annihilation.views.dashboard import (
    AGENT_ROWS,
    DASHBOARD_TOPICS,
    RECENT_EVENTS,
    events_recent,
)
from bursts.models import AgentRun, Burst, QuantumRun, Wave
from bursts.selectors import LIVE_AGENTS_SHOWN, dashboard_summary, dashboard_totals
from core.events import publish
from core.live import fragment_render
from core.models import Event
from quanta.models import Quantum
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db


def _agent(run: QuantumRun, **fields: Any) -> AgentRun:
    return AgentRun.objects.create(
        agent_id=f"{run.quantum_id}_s0_coder_{AgentRun.objects.count()}",
        quantum_id=run.quantum_id,
        quantum_run=run,
        role="coder",
        **fields,
    )


@pytest.fixture
def wave_world(redis_client: Any) -> dict[str, Any]:
    """An older wave with one agent, and the current wave: three runs, five agents."""
    old = Wave.objects.create(labels=["old"], status="finished")
    old_run = QuantumRun.objects.create(
        wave=old,
        burst=Burst.objects.create(wave=old, number=1),
        quantum=Quantum.objects.create(title="old", status="closed"),
        pipeline_name="default",
        status="done",
    )
    _agent(old_run, status="done", tokens_in=1, tokens_out=2, cost_usd=Decimal("0.5"))
    wave = Wave.objects.create(labels=["now"])
    burst = Burst.objects.create(wave=wave, number=1)
    runs = [
        QuantumRun.objects.create(
            wave=wave,
            burst=burst,
            quantum=Quantum.objects.create(title=f"q{i}", status="in_progress"),
            pipeline_name="default",
            status=status,
        )
        for i, status in enumerate(["running", "running", "done"])
    ]
    _agent(runs[0], status="running", phase="thinking", tokens_in=10, tokens_out=1)
    _agent(runs[0], status="waiting", phase="waiting", tokens_in=20, tokens_out=2)
    _agent(runs[1], status="running", phase="tool_use", tokens_in=30, tokens_out=3)
    _agent(
        runs[2], status="done", phase="done", tokens_in=40, tokens_out=4, cost_usd=Decimal("1.25")
    )
    _agent(runs[2], status="error", phase="done", tokens_in=50, tokens_out=5)
    make_quantum("open one")
    return {"wave": wave, "runs": runs}


def test_it_counts_the_current_wave_and_every_total(wave_world):
    summary = dashboard_summary()

    assert summary["wave"] == wave_world["wave"]
    assert summary["runs"] == {"running": 2, "done": 1}
    assert summary["runs_total"] == 3
    assert summary["agents"] == {"running": 2, "waiting": 1, "done": 1, "error": 1}
    assert summary["phases"] == {"thinking": 1, "tool_use": 1, "waiting": 1}
    assert summary["wave_spend"] == {
        "tokens_in": 150,
        "tokens_out": 15,
        "cost_usd": Decimal("1.25"),
    }
    assert summary["total_spend"] == {
        "tokens_in": 151,
        "tokens_out": 17,
        "cost_usd": Decimal("1.75"),
    }
    assert summary["quanta"] == {"closed": 1, "in_progress": 3, "open": 1}
    assert [a["status"] for a in summary["live_agents"]] == ["running", "waiting", "running"]
    assert [a["tokens"] for a in summary["live_agents"]] == [11, 22, 33]


def test_the_page_shows_the_figures(viewer_client, wave_world):
    html = viewer_client.get("/").content.decode()

    assert '<span class="muted num" id="runs-total">3</span>' in html
    assert '<td class="num" data-status="running">2</td>' in html
    assert "thinking 1" in html
    assert "$1.2500" in html and "151 / 17 tokens · $1.7500" in html
    assert len(re.findall(r'href="/agents/[0-9]', html)) == 3  # each agent's Focus page


def test_the_live_list_stops_at_its_bound_in_id_order(wave_world):
    run = wave_world["runs"][1]
    for _ in range(LIVE_AGENTS_SHOWN):
        _agent(run, status="pending")

    live = dashboard_summary()["live_agents"]

    assert len(live) == LIVE_AGENTS_SHOWN
    assert [a["id"] for a in live] == sorted(a["id"] for a in live)


def test_a_new_quantum_shows_at_once_and_a_status_change_once_the_totals_expire(
    wave_world, settings
):
    settings.DASHBOARD_TOTALS_TTL_S = 60
    assert dashboard_totals()["quanta"]["open"] == 1

    make_quantum("another")
    assert dashboard_totals()["quanta"]["open"] == 2  # a new key: the newest quantum changed

    Quantum.objects.filter(title="another").update(status="closed")
    assert dashboard_totals()["quanta"]["open"] == 2  # shared until the TTL ends

    settings.DASHBOARD_TOTALS_TTL_S = 0
    assert dashboard_totals()["quanta"] == {"closed": 2, "in_progress": 3, "open": 1}


def test_the_totals_expire_after_their_ttl(wave_world, settings, redis_client):
    settings.DASHBOARD_TOTALS_TTL_S = 5
    dashboard_totals()

    (key,) = redis_client.keys("dashboard:totals:*")
    assert 0 < redis_client.pttl(key) <= 5000


def test_a_row_shows_an_agents_new_values(viewer_client, wave_world):
    AGENT_ROWS.clear()
    first = viewer_client.get("/").content.decode()
    assert re.search(r"s-thinking\">thinking</span></td>\s*<td>.*?<td class=\"num\">11</td>", first)

    AgentRun.objects.filter(phase="thinking").update(phase="tool_use", tokens_in=100)
    again = viewer_client.get("/").content.decode()

    assert "s-thinking" not in again.split('id="live-agents"')[1]
    assert '<td class="num">101</td>' in again


def test_the_live_redraw_on_a_burst_event_shows_the_rows(viewer, wave_world):
    publish("burst:events", "burst_opened", {"wave_id": wave_world["wave"].pk})
    event = Event.objects.filter(topic="burst:events").latest("id")
    message = {
        "id": event.pk,
        "topic": event.topic,
        "type": event.type,
        "payload": event.payload,
        "created_at": event.created_at.isoformat(),
        "session_id": None,
    }

    html = fragment_render(message, page="dashboard", params={}, can_operate=False)  # type: ignore[arg-type]

    assert 'id="runs-total">3<' in html
    assert html.count('href="/agents/') == 3
    assert f'id="ev-{event.pk}"' in html


def test_the_recent_events_are_the_newest_of_the_dashboards_topics(viewer_client, redis_client):
    publish("quanta", "created", {"n": 0})
    for n in range(1, RECENT_EVENTS + 5):
        publish("burst:events", "run_finished", {"n": n})
        publish("agent:1_s0_coder", "text", {"text": f"agent {n}"})  # not the dashboard's
    publish("alerts", "fired", {"n": "last"})
    newest = list(
        Event.objects.filter(topic__in=DASHBOARD_TOPICS)
        .order_by("-id")
        .values_list("id", flat=True)[:RECENT_EVENTS]
    )

    assert [e.pk for e in events_recent()] == newest
    html = viewer_client.get("/").content.decode()
    assert [int(i) for i in re.findall(r'<li id="ev-(\d+)"', html)] == newest
    assert "n=last" in html and "agent 3" not in html
