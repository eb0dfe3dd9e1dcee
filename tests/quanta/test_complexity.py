"""The complexity classifier, and where it decides: create, update, import, the CLI and the form.
An operator's value is always kept."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from core.access import operator_ensure
from quanta.complexity import complexity_classify
from quanta.errors import InvalidQuantum
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.services import quantum_create, quantum_update

pytestmark = pytest.mark.django_db

STEPS = "$ sed -i 's/colour/color/' README.md\n$ git diff --stat"
FENCED = "Run:\n```bash\nruff format .\n# then\nruff check --fix \\\n  src\n```\n"


@pytest.mark.parametrize(
    ("title", "body", "complexity", "mechanical"),
    [
        # trivial: short, at most one file, a trivial keyword or mechanical steps
        ("Fix a typo in README.md", "", "trivial", False),
        ("Bump the version", "", "trivial", False),
        ("Reword the greeting", "The greeting says Hi; make it Hello.", "trivial", False),
        ("Apply the spelling change", STEPS, "trivial", True),
        ("Format the code", FENCED, "trivial", True),
        ("Clean up", "```sh\nrm -f build.log\n```", "trivial", True),
        # standard: no signal either way, or too much for trivial
        ("Add a greeting", "", "standard", False),
        ("Add a todo endpoint", "Return the todos as JSON from api.py and store.py.", "standard",
         False),
        ("Fix a typo", "In a.py, b.py and c.md.", "standard", False),
        ("Fix a typo", "word " * 80, "standard", False),
        ("", "", "standard", False),
        # steps with something else of substance are not mechanical
        ("Update the parser", "```python\nprint(1)\n```\n$ pytest", "standard", False),
        ("Bump it", "$ make bump\n" + "Explain why this matters to everyone. " * 8, "trivial",
         False),
        ("Apply it", "$ make bump\n" + "Explain why this matters to everyone. " * 8, "standard",
         False),
        ("Bump it", "```sh\nmake bump\n", "trivial", False),  # a fence never closed
        ("Bump it", "\n".join(f"$ echo {i}" for i in range(30)), "standard", False),
        # complex: overriding keywords (whole words, any case), length, many files
        ("Refactor the parser", STEPS, "complex", True),
        ("Fix a typo in the SECURITY notes", "", "complex", False),
        ("Rename things", "Mind the race between the two writers.", "complex", False),
        ("Add the migration for todos", "", "complex", False),
        ("Update auth", "", "complex", False),
        ("Fix a typo", "Touch a.py b.py c.py d.py e.py f.py", "complex", False),
        ("Describe it", "word " * 500, "complex", False),
        # not keywords: parts of words, and words in commands
        ("Fix a typo in the authorship line", "", "trivial", False),
        ("Tidy the raceway", "", "standard", False),
        ("Apply the change", "$ python manage.py migrate\n$ echo done", "trivial", True),
    ],
)  # fmt: skip
def test_it_classifies_by_length_files_and_keywords(title, body, complexity, mechanical):
    found = complexity_classify(title, body)

    assert (found.complexity, found.mechanical) == (complexity, mechanical), found.reasons
    assert found.reasons  # always says why
    assert bool(found.steps) == mechanical


def test_it_extracts_the_steps_as_commands():
    assert complexity_classify("Apply", STEPS).steps == (
        "sed -i 's/colour/color/' README.md",
        "git diff --stat",
    )
    assert complexity_classify("Format", FENCED).steps == ("ruff format .", "ruff check --fix src")


def test_it_says_why_in_words_the_operator_reads():
    found = complexity_classify("Refactor the parser in src/parse.py", "")
    assert found.summary == "5 words; names 1 file (src/parse.py); names 'refactor'"


@pytest.mark.parametrize(
    ("title", "body"),
    [
        pytest.param("Fix it", "x" * 5_000_000, id="huge-body"),
        pytest.param("Fix it", "$ echo hi\n" * 100_000, id="huge-steps"),
        pytest.param("Ünïcödé typo façade", "日本語のテキスト 🚀 $ echo ok\n\u202e\u200b", id="unicode"),
        pytest.param("```", "```sh", id="only-fences"),
        pytest.param("$ ", "$ \n$\n```\n```", id="empty-steps"),
    ],
)  # fmt: skip
def test_it_stays_deterministic_and_bounded_on_hostile_input(title, body):
    first = complexity_classify(title, body)
    assert first == complexity_classify(title, body)
    assert first.complexity in {"trivial", "standard", "complex"}
    assert len(first.steps) <= 20


# --- where it decides ------------------------------------------------------------------------


def test_create_classifies_when_no_complexity_is_given_and_keeps_an_operators():
    auto = quantum_create(title="Fix a typo in README.md")
    chosen = quantum_create(title="Fix a typo in README.md", complexity="complex")
    spelled = quantum_create(title="Refactor the parser", complexity="auto")

    assert (auto.complexity, auto.complexity_auto) == ("trivial", True)
    assert (chosen.complexity, chosen.complexity_auto) == ("complex", False)
    assert (spelled.complexity, spelled.complexity_auto) == ("complex", True)


def test_create_refuses_an_unknown_complexity_naming_the_choices():
    with pytest.raises(InvalidQuantum, match="complexity: must be one of trivial, standard"):
        quantum_create(title="x", complexity="huge")


def test_editing_an_auto_classified_quantum_classifies_it_again():
    quantum = quantum_create(title="Fix a typo")
    assert quantum.complexity == "trivial"

    quantum = quantum_update(quantum_id=quantum.pk, changes={"title": "Refactor the storage"})
    assert (quantum.complexity, quantum.complexity_auto) == ("complex", True)

    quantum = quantum_update(quantum_id=quantum.pk, changes={"body": "", "priority": 1})
    assert quantum.complexity == "complex"
    quantum = quantum_update(quantum_id=quantum.pk, changes={"title": "Add a greeting"})
    assert Quantum.objects.get(pk=quantum.pk).complexity == "standard"


def test_editing_an_operator_set_quantum_keeps_its_complexity_until_auto_is_asked():
    quantum = quantum_create(title="Add a greeting", complexity="standard")

    quantum = quantum_update(quantum_id=quantum.pk, changes={"title": "Refactor the storage"})
    assert (quantum.complexity, quantum.complexity_auto) == ("standard", False)

    quantum = quantum_update(quantum_id=quantum.pk, changes={"complexity": "auto"})
    assert (quantum.complexity, quantum.complexity_auto) == ("complex", True)

    quantum = quantum_update(quantum_id=quantum.pk, changes={"complexity": "trivial"})
    assert (quantum.complexity, quantum.complexity_auto) == ("trivial", False)


def test_import_classifies_records_without_a_complexity(tmp_path: Path):
    path = tmp_path / "quanta.yaml"
    path.write_text(
        "- title: Fix a typo in README.md\n"
        "- title: Fix a typo in README.md\n  complexity: complex\n"
        "- title: Refactor the parser\n  complexity: auto\n"
        f"- title: Apply it\n  body: {json.dumps(STEPS)}\n",
        encoding="utf-8",
    )

    ids = quanta_import(path=path)

    rows = dict(Quantum.objects.filter(pk__in=ids).values_list("pk", "complexity"))
    autos = dict(Quantum.objects.filter(pk__in=ids).values_list("pk", "complexity_auto"))
    assert [rows[i] for i in ids] == ["trivial", "complex", "complex", "trivial"]
    assert [autos[i] for i in ids] == [True, False, True, True]


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("quanta", *args, stdout=out)
    return out.getvalue()


def test_the_cli_classifies_when_complexity_is_omitted_and_shows_why():
    auto = json.loads(_cli("create", "Fix a typo in README.md", "--json"))
    chosen = json.loads(_cli("create", "Fix a typo", "--complexity", "complex", "--json"))

    assert auto["complexity"] == "trivial"
    assert Quantum.objects.get(pk=chosen["id"]).complexity_auto is False
    shown = _cli("show", str(auto["id"]))
    assert "· trivial (auto: 5 words; names 1 file (README.md); names 'typo')" in shown
    assert "· complex\n" in _cli("show", str(chosen["id"]))
    data = json.loads(_cli("show", str(auto["id"]), "--json"))
    assert data["complexity_auto"] is True and "names 'typo'" in data["complexity_reasons"]

    _cli("update", str(chosen["id"]), "--complexity", "auto")
    assert Quantum.objects.get(pk=chosen["id"]).complexity == "trivial"


def test_the_form_offers_auto_by_default_and_keeps_an_operators_choice(client):
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    page = client.get(reverse("quantum_create"))
    assert page.context["form"]["complexity"].value() == "auto"
    base = {"kind": "task", "priority": 2}

    client.post(reverse("quantum_create"), {**base, "title": "Fix a typo", "complexity": "auto"})
    client.post(reverse("quantum_create"), {**base, "title": "Fix a typo 2",
                                            "complexity": "complex"})  # fmt: skip

    auto = Quantum.objects.get(title="Fix a typo")
    chosen = Quantum.objects.get(title="Fix a typo 2")
    assert (auto.complexity, auto.complexity_auto) == ("trivial", True)
    assert (chosen.complexity, chosen.complexity_auto) == ("complex", False)
    edit = client.get(reverse("quantum_edit", args=[auto.pk]))
    assert edit.context["form"]["complexity"].value() == "auto"
    # Saving the edit page with a new title keeps it auto and classifies it again.
    client.post(
        reverse("quantum_edit", args=[auto.pk]),
        {**base, "title": "Redesign the storage", "complexity": "auto"},
    )
    auto.refresh_from_db()
    assert (auto.complexity, auto.complexity_auto) == ("complex", True)


def test_the_quantum_page_marks_an_auto_classified_complexity(client):
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    auto = quantum_create(title="Fix a typo")
    chosen = quantum_create(title="Fix a typo", complexity="trivial")

    assert "(auto)" in client.get(reverse("quantum", args=[auto.pk])).content.decode()
    assert "(auto)" not in client.get(reverse("quantum", args=[chosen.pk])).content.decode()
