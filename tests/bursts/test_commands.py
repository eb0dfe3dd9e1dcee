"""The operator's commands: start_wave (follow, JSON, exit codes) and waves list/show/cancel."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from bursts.models import Wave, WaveStatus
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_start_wave_follows_to_the_end_and_exits_zero(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline("one", ("sequential", ["coder"]), ("fan_out", ["reviewer", "tester"]), default=True)
    q = quantum_create(title="ship it")

    call_command("start_wave", "--follow", "--json", "--timeout", "30")

    captured = capsys.readouterr()
    detail = json.loads(captured.out)
    assert detail["status"] == "done" and detail["stats"]["runs"] == {"done": 1}
    assert [a["agent_id"] for a in detail["runs"][0]["agents"]] == [
        f"{q.pk}_s0_coder",
        f"{q.pk}_s1_reviewer",
        f"{q.pk}_s1_tester",
    ]
    assert "runs: " in captured.err  # progress lines go to stderr with --json


def test_start_wave_exits_one_when_a_run_failed(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    quantum_create(title="doomed", body="fail coder 9")

    with pytest.raises(CommandError) as exc:
        call_command("start_wave", "--follow", "--timeout", "30")

    assert exc.value.returncode == 1
    out = capsys.readouterr().out
    assert "error" in out and "failed on purpose" in out


def test_waves_list_show_and_cancel(worker: Worker, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline("one", ("sequential", ["coder"]), default=True)
    quantum_create(title="slow", body="sleep coder 20")
    call_command("start_wave", "--json")
    wave_id = json.loads(capsys.readouterr().out)["wave_id"]

    call_command("waves", "list", "--json")
    assert json.loads(capsys.readouterr().out)[0]["id"] == wave_id
    call_command("waves", "cancel", str(wave_id), "--json")
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    call_command("waves", "show", str(wave_id), "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["runs"][0]["status"] == "cancelled"
    assert shown["runs"][0]["quantum_status"] == "open"
    with pytest.raises(CommandError, match="nothing to cancel"):
        call_command("waves", "cancel", str(wave_id))
    assert Wave.objects.get(pk=wave_id).status == WaveStatus.CANCELLED
