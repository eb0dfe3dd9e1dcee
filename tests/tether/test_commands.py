"""`manage.py tether ...`: readable and --json output, exit 1 on refusals, 2 on bad usage."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from tether.models import Drift, Reaching


@pytest.fixture
def reaching(db, make_quantum) -> Reaching:
    quantum = make_quantum()
    return Reaching.objects.create(
        quantum=quantum,
        question="Retry it?",
        assumption="it stays blocked",
        priority="high",
        deadline=timezone.now() + timedelta(seconds=60),
    )


def run(*args: str) -> str:
    out = StringIO()
    call_command("tether", *args, stdout=out)
    return out.getvalue()


def test_it_lists_and_answers_questions(reaching: Reaching, redis_client) -> None:
    assert "Retry it?" in run("questions")
    data = json.loads(run("questions", "--json"))
    assert [(q["id"], q["priority"]) for q in data] == [(reaching.pk, "high")]

    answer = json.loads(run("answer", str(reaching.pk), "leave it", "--json"))

    assert answer["kind"] == "quarantine"
    assert json.loads(run("questions", "--json")) == []


def test_it_grounds_and_notes_drifts(reaching: Reaching) -> None:
    drift = Drift.objects.create(quantum=reaching.quantum, assumption="UTC")
    other = Drift.objects.create(quantum=reaching.quantum, assumption="tabs")
    assert "UTC" in run("drifts")

    assert "grounded" in run("ground", str(drift.pk))
    noted = json.loads(run("note", str(other.pk), "fine for now", "--json"))
    assert noted["status"] == "open" and noted["notes"][0]["text"] == "fine for now"
    assert "tabs" in run("drifts") and "UTC" not in run("drifts")  # a noted drift stays open
    assert len(json.loads(run("drifts", "--status", "all", "--json"))) == 2
    with pytest.raises(CommandError, match="already grounded"):
        run("ground", str(drift.pk))


def test_it_refuses_unknown_ids(db) -> None:
    for args in (("answer", "999", "x"), ("ground", "999"), ("approve", "999"),
                 ("approve-mutation", "999"), ("show-change", "999")):  # fmt: skip
        with pytest.raises(CommandError, match="no "):
            run(*args)


def test_it_exits_2_on_bad_usage(db) -> None:
    def status(*args: str) -> int:
        return subprocess.run(
            [sys.executable, "manage.py", "tether", *args],
            cwd=Path(settings.BASE_DIR),
            capture_output=True,
            check=False,
        ).returncode

    assert status("reject", "1") == 2  # --reason is required
    assert status("answer", "abc", "x") == 2
    assert status("frobnicate") == 2


@pytest.mark.parametrize("argv", [["tether", "questions"], ["check"]])
def test_a_command_that_calls_no_model_imports_no_model_sdk(db, argv) -> None:
    """`tether questions` answers fast: it imports no model SDK, and neither does loading every
    view (what the system checks do); the worker imports it when it starts."""
    import subprocess
    import sys

    from tests.bursts.conftest import ROOT, worker_env

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "manage.py", *argv],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    assert "anthropic" not in modules and "openai" not in modules
    assert "django.core.management" in modules  # the import log was read


def test_a_command_loads_no_web_server_and_runserver_is_daphnes(db) -> None:
    """daphne's app (Twisted's server) is loaded by `runserver` alone: `tether questions` does
    not import it, nor the channel layer, and `runserver` is still daphne's (HTTP and
    websockets)."""
    import subprocess
    import sys

    from tests.bursts.conftest import ROOT, worker_env

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], cwd=ROOT, env=worker_env(), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    proc = run("-X", "importtime", "manage.py", "tether", "questions")
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    assert "django.core.management" in modules  # the import log was read
    assert not {"daphne", "twisted"} & modules
    assert "channels_redis" not in modules  # the live events' layer: imported where events go
    runserver = run("manage.py", "runserver", "--help")
    assert runserver.returncode == 0, runserver.stderr[-2000:]
    assert "--websocket_handshake_timeout" in runserver.stdout


def test_tether_questions_loads_no_admin_and_no_api(db) -> None:
    """A command loads no admin module (the admin is discovered by the URLconf) and not the
    API's framework."""
    import subprocess
    import sys

    from tests.bursts.conftest import ROOT, worker_env

    def modules(*argv: str) -> set[str]:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "manage.py", *argv],
            cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
        assert "django.core.management" in names, proc.stderr[-2000:]  # the log was read
        return names

    questions = modules("tether", "questions")
    loaded = {"quanta.admin", "psychonauts.admin", "tether.admin", "ninja"} & questions
    assert not loaded
