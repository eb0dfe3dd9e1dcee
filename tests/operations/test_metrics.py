"""/metrics over real HTTP: what a real worker process counted is there (multiprocess files),
the state gauges read at scrape time, the bearer token, and a dead process's counts kept when
its files are folded into the archives."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bursts.services import wave_start
from core import metrics
from quanta.services import quantum_create
from tests.bursts.conftest import ROOT, Worker, pipeline, wait_wave

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(url: str, **headers: str) -> str:
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def test_it_shows_what_a_worker_process_counted(
    make_worker: Callable[..., Worker], live_server
) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    quantum_create(title="works")
    quantum_create(title="fails", body="fail coder 1")
    before = scrape(live_server.url)
    worker = make_worker("metrics", beat=False)

    wave = wait_wave(wave_start().pk, timeout=30)
    after = scrape(live_server.url)

    stage = "annihilation_agent_stage_seconds_count"
    assert value(after, stage, status="done") - value(before, stage, status="done") == 1
    assert value(after, stage, status="error") - value(before, stage, status="error") == 1
    errors = "annihilation_errors_total"
    assert value(after, errors, kind="agent") - value(before, errors, kind="agent") == 1
    waves = "annihilation_wave_duration_seconds_count"
    assert value(after, waves, status=wave.status) - value(before, waves, status=wave.status) == 1
    # Counted in the worker, not here: its own file, named by its pid.
    assert worker.proc is not None
    assert (metrics.metrics_dir() / f"histogram_{worker.proc.pid}.db").exists()
    # The state gauges, read at scrape time.
    assert value(after, "annihilation_agents", status="pending") == 0
    assert "annihilation_queue_depth" in after
    assert 'annihilation_endpoint_up{endpoint="claude-sonnet-4-6"' in after


def test_it_wants_the_bearer_token_when_one_is_set(live_server, settings) -> None:
    settings.METRICS_TOKEN = "s3cret-metrics"
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(live_server.url, Authorization="Bearer wrong")
    assert refused.value.code == 401
    assert refused.value.headers["Content-Type"] == "application/problem+json"
    assert b'"status": 401' in refused.value.read()
    assert "annihilation_queue_depth" in scrape(
        live_server.url, Authorization="Bearer s3cret-metrics"
    )


def test_a_dead_process_counts_survive_the_folding_of_its_files() -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from core import metrics; "
            "import os; metrics.error('folding-test'); print(os.getpid())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(child.stdout.strip())
    own = metrics.metrics_dir() / f"counter_{pid}.db"
    assert own.exists()
    before = metrics.counter_totals()["annihilation_errors_total"]

    assert metrics.files_compact() >= 1

    assert not own.exists()
    assert (metrics.metrics_dir() / "counter_archive.db").exists()
    assert metrics.counter_totals()["annihilation_errors_total"] == before


def test_it_counts_the_tokens_of_an_agent_run(repo, client) -> None:
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.runtime.execute import agent_run_execute
    from psychonauts.runtime.runs import agent_run_create

    roles_sync_defaults()
    run = agent_run_create(quantum_id=quantum_create(title="Add a greeting").pk, role="coder")
    before = client.get("/metrics").content.decode()

    assert agent_run_execute(agent_run_id=run.pk).status == "done"

    after = client.get("/metrics").content.decode()
    run.refresh_from_db()
    tokens = "annihilation_tokens_total"
    grown_in = value(after, tokens, direction="in") - value(before, tokens, direction="in")
    grown_out = value(after, tokens, direction="out") - value(before, tokens, direction="out")
    assert (grown_in, grown_out) == (run.tokens_in, run.tokens_out)
    assert grown_in > 0


def test_a_tether_questions_wait_is_counted_when_it_is_answered_and_when_it_times_out(
    client,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from tether.services import reaching_answer, reaching_expire, reaching_quarantine

    first, second = (
        reaching_quarantine(quantum_id=quantum_create(title=t).pk, history="", failures=3)
        for t in ("Answered", "Timed out")
    )
    before = client.get("/metrics").content.decode()

    reaching_answer(reaching_id=first.pk, text="retry")
    assert reaching_expire(reaching_id=second.pk, now=timezone.now() + timedelta(days=30))

    after = client.get("/metrics").content.decode()
    count = "annihilation_tether_wait_seconds_count"
    for outcome in ("answered", "timed_out"):
        grown = value(after, count, outcome=outcome) - value(before, count, outcome=outcome)
        assert grown == 1, outcome
    waited = "annihilation_tether_wait_seconds_sum"
    grown_s = value(after, waited, outcome="timed_out") - value(before, waited, outcome="timed_out")
    assert grown_s >= 30 * 86400 - 60
