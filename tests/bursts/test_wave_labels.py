"""A wave's labels are checked as quanta's are: at the command line, in the service, one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from bursts.errors import InvalidWave
from bursts.models import Wave
from bursts.services import wave_start

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["", " ", "../../x", "<script>", "x" * 65, "a,b", "-dash"]


@pytest.mark.django_db
@pytest.mark.parametrize("label", HOSTILE)
def test_start_wave_refuses_a_label_no_quantum_could_carry(label):
    with pytest.raises(CommandError, match="is not a label"):
        call_command("start_wave", f"--label={label}")
    with pytest.raises(InvalidWave, match="is not a label"):
        wave_start(labels=[label])
    assert not Wave.objects.exists()


@pytest.mark.django_db
def test_a_good_label_is_kept_whole():
    label = "a" * 64
    wave = wave_start(labels=[label, "team:ui/x"])
    assert wave.labels == sorted([label, "team:ui/x"])


@pytest.mark.django_db(transaction=True)
def test_from_a_terminal_a_bad_label_exits_two_with_one_line():
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "start_wave", "--label", "x" * 70],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("manage.py start_wave: error: argument --label: 'xxxx")
    assert "is not a label" in line and len(line) < 300
    assert not Wave.objects.exists()
