"""`manage.py repos add|list|show|set|remove`."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from bursts.models import Wave
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum
from quanta.services import quantum_create
from repos.models import Repository

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("repos", *args, stdout=out)
    return out.getvalue()


def test_it_adds_lists_shows_and_removes_a_repository(repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    env = tmp_path / "env.yaml"
    env.write_text("setup: [python3 -m venv .venv]\n")

    assert "added repository second" in run(
        "add", "second", str(path), "--branch", "main", "--verify", "python3 -m pytest -q",
        "--environment", str(env),
    )  # fmt: skip
    listed = json.loads(run("list", "--json"))
    assert [r["name"] for r in listed] == ["default", "second"]
    assert listed[0]["location"] == str(repo) and listed[0]["is_default"]
    shown = run("show", "second")
    assert str(path) in shown and "python3 -m pytest -q" in shown and "venv" in shown
    assert json.loads(run("show", "second", "--json"))["target_branch"] == "main"
    table = run("list")
    assert "second" in table and "default" in table

    assert "removed repository second" in run("remove", "second")
    assert [r["name"] for r in json.loads(run("list", "--json"))] == ["default"]


def test_bad_input_is_one_clear_error(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="is not a git repository"):
        run("add", "nothing", str(tmp_path))
    path = demo_repo_ensure(tmp_path / "second")
    with pytest.raises(CommandError, match="has no branch 'nope'"):
        run("add", "second", str(path), "--branch", "nope")
    run("add", "second", str(path))
    with pytest.raises(CommandError, match="already registered"):
        run("add", "second", str(path))
    bad = tmp_path / "bad.yaml"
    bad.write_text("setup: [unclosed\n")
    with pytest.raises(CommandError, match="environment declaration"):
        run("set", "second", "--environment", str(bad))
    second = Repository.objects.get(name="second", removed_at__isnull=True)
    quantum_create(title="open", repository_id=second.pk)
    with pytest.raises(CommandError, match="1 open quanta"):
        run("remove", "second")
    with pytest.raises(CommandError, match="no repository named 'ghost'"):
        run("show", "ghost")
    assert Repository.objects.filter(name="second", removed_at__isnull=True).count() == 1


def test_quanta_and_waves_are_made_in_the_repository_named(repo: Path, tmp_path: Path) -> None:
    run("add", "second", str(demo_repo_ensure(tmp_path / "second")))
    second = Repository.objects.get(name="second", removed_at__isnull=True)

    call_command("quanta", "create", "over there", "--repository", "second", stdout=StringIO())
    call_command("start_wave", "--repository", "second", "--json", stdout=StringIO())

    assert Quantum.objects.get(title="over there").repository_id == second.pk
    assert Wave.objects.get().repository_id == second.pk
    with pytest.raises(CommandError, match="no repository named 'ghost'"):
        call_command("quanta", "create", "lost", "--repository", "ghost", stdout=StringIO())
    assert not Quantum.objects.filter(title="lost").exists()
