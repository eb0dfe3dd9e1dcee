from __future__ import annotations

import shutil

import pytest
from django.core.management import call_command

from bursts.models import Burst, QuantumRun, RunStatus, Wave
from quanta.models import Quantum
from tether.models import Reaching, ReachingStatus
from tether.services import reaching_quarantine

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")
def test_it_loads_the_demo_and_says_how_agents_are_contained(capsys, settings, tmp_path):
    settings.ANNIHILATION_HOME = tmp_path / "home"

    call_command("demo", "--no-wave")

    out = capsys.readouterr().out
    assert "Loaded 11 demo quanta" in out
    assert "Agent sandbox: on: bubblewrap" in out
    assert "user 'operator', password 'annihilation'" in out


def test_running_the_demo_again_keeps_the_first_runs_history(capsys, settings, tmp_path):
    settings.ANNIHILATION_HOME = tmp_path / "home"
    call_command("demo", "--no-wave")
    first = list(Quantum.objects.filter(import_key__startswith="demo-1/").order_by("pk"))
    assert len(first) == 11
    # What a first wave left: a merged quantum with its run, and one blocked with a question.
    merged, blocked = first[0], first[1]
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    run = QuantumRun.objects.create(wave=wave, burst=burst, quantum=merged, status=RunStatus.DONE)
    Quantum.objects.filter(pk=merged.pk).update(status="closed", close_reason="merged")
    Quantum.objects.filter(pk=blocked.pk).update(status="blocked")
    question = reaching_quarantine(quantum_id=blocked.pk, history="", failures=3)
    capsys.readouterr()

    call_command("demo", "--no-wave")

    out = capsys.readouterr().out
    assert "Loaded 11 demo quanta from quanta.yaml (demo set 2)" in out
    assert Quantum.objects.filter(import_key__startswith="demo-2/").count() == 11
    assert QuantumRun.objects.filter(pk=run.pk).exists()  # the history stays
    assert Quantum.objects.get(pk=merged.pk).status == "closed"
    open_first = [q.pk for q in first if q.pk != merged.pk and q.status != "deferred"]
    assert all(Quantum.objects.get(pk=pk).status == "deferred" for pk in open_first)
    assert f"#{blocked.pk}" in out and "are deferred" in out
    # The old set's question does not linger on the Tether page.
    question.refresh_from_db()
    assert question.status == ReachingStatus.WITHDRAWN
    assert not Reaching.objects.filter(status=ReachingStatus.PENDING).exists()
    # The ready set is the new demo set's alone.
    ready = Quantum.objects.filter(status="open", open_blockers=0)
    assert all(q.import_key.startswith("demo-2/") for q in ready)


def test_the_demo_backlog_tells_the_story_of_its_repository(tmp_path):
    """The backlog is about the repository the demo makes: a calculator."""
    from pathlib import Path

    import yaml

    from psychonauts.workspaces.worktrees import demo_repo_ensure

    repo = demo_repo_ensure(tmp_path / "repo")
    files = {p.name for p in repo.iterdir()}
    backlog = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "demo" / "quanta.yaml").read_text()
    )
    text = " ".join(f"{q['title']} {q.get('body', '')}" for q in backlog).lower()
    assert "calc" in text and "todos" not in text and "todo list" not in text
    for q in backlog:
        for command in q.get("verify_commands", []):
            for name in ("calc.py",):
                if name in command:
                    assert name in files
    assert "calc" in (repo / "README.md").read_text().lower()
