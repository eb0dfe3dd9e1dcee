from __future__ import annotations

import shutil

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")
def test_it_loads_the_demo_and_says_how_agents_are_contained(capsys, settings, tmp_path):
    settings.ANNIHILATION_HOME = tmp_path / "home"

    call_command("demo", "--no-wave")

    out = capsys.readouterr().out
    assert "Loaded 11 demo quanta" in out
    assert "Agent sandbox: on: bubblewrap" in out
    assert "user 'operator', password 'annihilation'" in out
