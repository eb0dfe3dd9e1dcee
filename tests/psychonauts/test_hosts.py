"""Hosts are visible: each agent run names the host it runs on (ANNIHILATION_HOST) in the
registry, `manage.py psychonaut agents`, the dashboard and the Focus page, and each Celery worker
notes its host in Redis with its heartbeat."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils.timezone import now
from pytest_django.fixtures import Settings as SettingsWrapper

from bursts.models import AgentRun, AgentStatus
from bursts.services import wave_start
from bursts.services.agent_runs import agent_run_start
from core.access import operator_ensure
from core.events import EventMessage
from core.live import fragment_render
from core.workers import worker_name, workers_by_host, workers_consuming_seen
from psychonauts.routing.registry import registry_hosts, registry_list, registry_rebuild
from psychonauts.runtime.execute import agent_run_execute
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, fast_settings, make_worker, pipeline, step_log, wait_wave
from tests.polling import wait_for

__all__ = ["fast_settings", "make_worker", "step_log"]  # the real workers' fixtures


def agents_json() -> list[dict[str, Any]]:
    out = StringIO()
    call_command("psychonaut", "agents", "--rebuild", "--json", stdout=out)
    entries: list[dict[str, Any]] = json.loads(out.getvalue())
    return entries


def operator_client(client: Client) -> Client:
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    return client


@pytest.mark.django_db
def test_it_names_the_host_of_each_agent_in_the_registry_the_cli_and_the_dashboard(
    make_run: Callable[..., AgentRun],
    settings: SettingsWrapper,
    redis_client: Any,
    client: Client,
) -> None:
    """Two hosts start an agent each, as a slot's start does; a third is still pending."""
    started = {}
    for host in ("h1", "h2"):
        settings.ANNIHILATION_HOST = host
        run = make_run("coder")
        assert agent_run_start(agent_run_id=run.pk, context="", worker=worker_name(), now=now())
        started[host] = run.pk
    pending = make_run("reviewer")

    entries = {e["agent_run_id"]: e for e in agents_json()}
    assert {e["host"] for e in entries.values()} == {"h1", "h2", ""}
    assert entries[started["h2"]]["worker"].startswith("h2:")
    assert entries[pending.pk]["host"] == ""
    assert AgentRun.objects.get(pk=started["h1"]).host == "h1"

    table = StringIO()
    call_command("psychonaut", "agents", stdout=table)
    header, rows = table.getvalue().splitlines()[1], table.getvalue().splitlines()[3:]
    assert header.split()[5] == "host"
    assert {row.split()[0]: row.split()[5] for row in rows if "running" in row} == {
        str(started["h1"]): "h1",
        str(started["h2"]): "h2",
    }

    assert registry_hosts() == [
        {"host": "h1", "workers": [], "agents_running": 1},
        {"host": "h2", "workers": [], "agents_running": 1},
    ]
    page = operator_client(client).get(reverse("dashboard")).content.decode()
    # A burst's event redraws the card live, with what is running now.
    settings.ANNIHILATION_HOST = "h1"
    assert agent_run_start(agent_run_id=pending.pk, context="", worker=worker_name(), now=now())
    event: EventMessage = {
        "id": 1, "topic": "burst:events", "type": "agent_started", "payload": {},
        "created_at": now().isoformat(), "session_id": None,
    }  # fmt: skip
    fragment = fragment_render(event, page="dashboard", params={}, can_operate=False)
    for html, running in ((page, {"h1": 1, "h2": 1}), (fragment, {"h1": 2, "h2": 1})):
        for host, n in running.items():
            row = html.split(f'<tr data-host="{host}">', 1)[1].split("</tr>", 1)[0]
            assert f'data-agents="{n}"' in row and 'data-workers="0"' in row, row


@pytest.mark.django_db
def test_an_entry_written_without_a_host_gets_its_workers_host(
    make_run: Callable[..., AgentRun], redis_client: Any
) -> None:
    run = make_run("coder")
    registry_rebuild()
    old = {k: v for k, v in json.loads(redis_client.hget("agents:registry", str(run.pk))).items()}
    old.pop("host")
    old["worker"] = "old-host:12:Thread-3"
    redis_client.hset("agents:registry", str(run.pk), json.dumps(old))

    assert [e["host"] for e in registry_list()] == ["old-host"]


@pytest.mark.django_db
def test_an_agent_executed_on_a_host_shows_it_on_its_focus_page(
    repo: Path,
    make_run: Callable[..., AgentRun],
    settings: SettingsWrapper,
    client: Client,
) -> None:
    settings.ANNIHILATION_HOST = "h7"
    run = make_run("reviewer")

    outcome = agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert outcome.status == "done", outcome.error
    assert run.worker.startswith("h7:") and run.host == "h7"
    page = operator_client(client).get(reverse("focus", args=[run.pk])).content.decode()
    assert '<code id="agent-host" title="h7:' in page and ">h7</code>" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_workers_on_two_hosts_list_their_hosts_and_run_agents_there(
    make_worker: Callable[..., Worker], client: Client
) -> None:
    """Two real workers, ANNIHILATION_HOST h1 and h2, one agent at a time each: a wave's agents
    run on both, each named after its host, and both hosts show on the dashboard with their
    worker; a worker that stops leaves the list."""
    workers = {}
    for host in ("h1", "h2"):
        w = make_worker(host, beat=host == "h1", start=False, ANNIHILATION_HOST=host)
        w.concurrency = 1
        workers[host] = w.start()
    nodes = {host: f"{w.name}@{os.uname().nodename}" for host, w in workers.items()}
    wait_for(lambda: workers_by_host() == {h: [n] for h, n in nodes.items()}, timeout=10)
    # Their heartbeats also name the queues they consume (the dashboard reads them from there).
    wait_for(
        lambda: workers_consuming_seen() == {n: ["celery"] for n in nodes.values()}, timeout=10
    )

    pipeline("hosts", ("sequential", ["coder"]), default=True)
    for i in range(4):
        quantum_create(title=f"q{i}", body="sleep coder 3")
    wave = wave_start()
    # One agent at a time per worker: two running at once are on both hosts.
    wait_for(lambda: AgentRun.objects.filter(status=AgentStatus.RUNNING).count() == 2, timeout=20)
    running = {e["host"] for e in agents_json() if e["status"] == "running"}
    html = operator_client(client).get(reverse("dashboard")).content.decode()

    assert wait_wave(wave.pk, timeout=40).status == "done"
    assert running == {"h1", "h2"}
    for host, node in nodes.items():
        row = html.split(f'<tr data-host="{host}">', 1)[1].split("</tr>", 1)[0]
        assert f"<code>{node}</code>" in row and 'data-agents="1"' in row, row
    assert {a.host for a in AgentRun.objects.all()} == {"h1", "h2"}

    workers["h2"].stop()
    assert workers_by_host() == {"h1": [nodes["h1"]]}
