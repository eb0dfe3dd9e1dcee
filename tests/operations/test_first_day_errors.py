"""The configuration mistakes a new operator makes first each end in one line that says what to
do, and no traceback: no API key, no repository, a database that is not there, a setting that
is wrong, and a reader that stops reading (`--json | head`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from bursts.models import AgentRun
from quanta.services import quantum_create
from tests.bursts.conftest import ROOT, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT, env=worker_env(**env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def test_an_anthropic_run_without_a_key_is_one_line_and_leaves_no_run(
    tmp_path: Path, monkeypatch, settings
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings.ANTHROPIC_API_KEY = ""
    quantum = quantum_create(title="needs a model")
    with pytest.raises(CommandError, match="needs an API key: set ANTHROPIC_API_KEY"):
        call_command("psychonaut", "run", "--quantum", str(quantum.pk), "--role", "coder",
                     "--provider", "anthropic")  # fmt: skip
    assert not AgentRun.objects.exists()


def test_a_run_without_a_repository_says_how_to_get_one(tmp_path: Path, settings) -> None:
    settings.ANNIHILATION_REPO = str(tmp_path / "nowhere")
    quantum = quantum_create(title="needs a repository")
    with pytest.raises(CommandError, match=r"no repository at ANNIHILATION_REPO=.*manage\.py demo"):
        call_command("psychonaut", "run", "--quantum", str(quantum.pk), "--role", "coder",
                     "--provider", "scripted")  # fmt: skip
    (tmp_path / "plain").mkdir()
    settings.ANNIHILATION_REPO = str(tmp_path / "plain")
    with pytest.raises(CommandError, match="is not a git repository: run `git init`"):
        call_command("psychonaut", "run", "--quantum", str(quantum.pk), "--role", "coder",
                     "--provider", "scripted")  # fmt: skip
    assert not AgentRun.objects.exists()


def test_start_wave_warns_of_a_forced_provider_without_its_key(tmp_path: Path) -> None:
    result = manage(
        "start_wave", ANNIHILATION_PROVIDER="anthropic", ANTHROPIC_API_KEY="",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_REPO=str(tmp_path / "nowhere"), ANNIHILATION_PING_TIMEOUT_S="0.1",
    )  # fmt: skip
    assert "warning: the anthropic provider needs an API key" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_database_that_is_not_there_is_one_line_at_once() -> None:
    result = manage("tether", "questions", DATABASE_URL="postgres://postgres@127.0.0.1:1/nope")
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "cannot reach the database nope at 127.0.0.1:1 (DATABASE_URL)" in line
    assert "scripts/services.sh start" in line


def test_a_wrong_setting_is_one_line() -> None:
    result = manage("tether", "questions", DATABASE_URL="mysql://somewhere/db")
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "manage.py: configuration error: DATABASE_URL: only postgres:// URLs are supported, "
        "got scheme 'mysql'"
    )


def test_json_into_a_reader_that_left_ends_quietly() -> None:
    """`... --json | head`: the reader is gone before the command writes (here from the start,
    so the test does not depend on how much a pipe holds)."""
    for n in range(3):
        quantum_create(title=f"quantum number {n}")
    command = [sys.executable, "manage.py", "quanta", "list", "--json"]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141  # as a shell shows a writer stopped by SIGPIPE
    assert err == ""


@pytest.mark.parametrize("argv", [["start_wave"], ["tether", "questions"]])
def test_a_redis_that_is_not_there_is_one_line_at_once(argv: list[str]) -> None:
    result = manage(*argv, REDIS_URL="redis://127.0.0.1:1/0")
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "cannot reach Redis at 127.0.0.1:1 (REDIS_URL)" in line and "fix REDIS_URL" in line
