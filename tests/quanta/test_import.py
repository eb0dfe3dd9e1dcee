from __future__ import annotations

import json
import textwrap

import pytest

from quanta.errors import ImportFailed
from quanta.importer import quanta_import
from quanta.models import Comment, Dependency, Quantum
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_it_imports_yaml_with_refs_parents_edges_and_comments(tmp_path):
    existing = make_quantum("existing")
    path = write(
        tmp_path,
        "q.yaml",
        f"""\
        - ref: epic
          title: Ship login
          kind: epic
        - ref: schema
          title: Design the schema
          parent: epic
          priority: 1
          labels: [backend]
          comments: ["first note", {{author: ada, author_kind: psychonaut, body: "second"}}]
        - title: Build the API
          parent: epic
          depends_on: [schema, {existing.pk}]
          related: [schema]
        - title: Old work
          status: closed
          close_reason: done long ago
        """,
    )
    ids = quanta_import(path=path)
    assert len(ids) == 4
    epic, schema, api, old = (Quantum.objects.get(pk=i) for i in ids)
    assert schema.parent_id == epic.pk and api.parent_id == epic.pk
    assert schema.labels == ["backend"] and schema.priority == 1
    assert set(Dependency.objects.filter(quantum=api).values_list("depends_on_id", "kind")) == {
        (schema.pk, "blocks"),
        (existing.pk, "blocks"),
        (schema.pk, "related"),
    }
    assert list(Comment.objects.filter(quantum=schema).values_list("author", flat=True)) == [
        "import",
        "ada",
    ]
    assert old.status == "closed" and old.close_reason == "done long ago" and old.closed_at


def test_it_imports_json_lines(tmp_path):
    path = write(
        tmp_path,
        "q.jsonl",
        '{"ref": "a", "title": "A"}\n\n{"title": "B", "depends_on": ["a"]}\n',
    )
    a, b = quanta_import(path=path)
    assert Dependency.objects.get(quantum_id=b).depends_on_id == a


def test_it_reports_every_problem_with_line_and_field_and_writes_nothing(tmp_path):
    path = write(
        tmp_path,
        "bad.yaml",
        """\
        - title: fine
        - title: ""
        - title: bad priority
          priority: 9
        - title: typo
          prority: 1
        - title: dangling
          depends_on: [nowhere]
        """,
    )
    with pytest.raises(ImportFailed) as exc:
        quanta_import(path=path)
    problems = exc.value.problems
    assert "bad.yaml:2: title: must not be empty" in problems
    assert "bad.yaml:4: priority: must be 0..4 (0 = critical), got 9" in problems
    assert "bad.yaml:6: prority: unknown field" in problems
    assert Quantum.objects.count() == 0


def test_it_reports_unresolved_refs_after_fields_are_valid(tmp_path):
    path = write(tmp_path, "refs.yaml", "- title: a\n  depends_on: [nowhere, 999]\n")
    with pytest.raises(ImportFailed) as exc:
        quanta_import(path=path)
    assert exc.value.problems == [
        "refs.yaml:1: depends_on: no record with ref 'nowhere' in this file",
        "refs.yaml:1: depends_on: no quantum #999",
    ]


def test_it_refuses_a_cycle_inside_the_file(tmp_path):
    path = write(
        tmp_path,
        "cycle.yaml",
        """\
        - {ref: a, title: A, depends_on: [c]}
        - {ref: b, title: B, depends_on: [a]}
        - {ref: c, title: C, depends_on: [b]}
        """,
    )
    with pytest.raises(ImportFailed, match=r"depends_on: cycle a -> c -> b -> a"):
        quanta_import(path=path)
    assert Quantum.objects.count() == 0


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("broken.yaml", "- title: [unclosed\n", "broken.yaml:2: not valid YAML"),
        ("broken.jsonl", '{"title": "ok"}\n{"title": \n', "broken.jsonl:2: not valid JSON"),
        ("scalar.yaml", "just text\n", "expected a list of quanta"),
        ("dupes.yaml", "- {ref: a, title: A}\n- {ref: a, title: B}\n", "ref: 'a' is already used"),
    ],
)
def test_it_explains_malformed_files(tmp_path, name, text, message):
    with pytest.raises(ImportFailed, match=message):
        quanta_import(path=write(tmp_path, name, text))


def test_it_imports_nothing_from_an_empty_file(tmp_path):
    assert quanta_import(path=write(tmp_path, "empty.yaml", "")) == []


def test_export_round_trips_through_import(tmp_path, capsys):
    from django.core.management import call_command

    path = write(
        tmp_path,
        "src.yaml",
        """\
        - {ref: a, title: A, labels: [x], comments: [hello]}
        - {ref: b, title: B, depends_on: [a], parent: a}
        """,
    )
    quanta_import(path=path)
    call_command("quanta", "export", "--format", "jsonl")
    exported = capsys.readouterr().out
    records = [json.loads(line) for line in exported.splitlines()]
    assert records[1]["depends_on"] == [records[0]["ref"]]
    Quantum.objects.all().delete()
    again = write(tmp_path, "again.jsonl", exported)
    a, b = quanta_import(path=again)
    assert Dependency.objects.get(quantum_id=b).depends_on_id == a
    assert Quantum.objects.get(pk=b).parent_id == a
    assert Quantum.objects.get(pk=a).comments.get().body == "hello"


def test_imported_quanta_are_ready_exactly_when_their_blockers_are_closed(tmp_path):
    from quanta import services
    from quanta.selectors import quanta_ready, quanta_search

    open_existing = make_quantum("open existing")
    closed_existing = make_quantum("closed existing")
    services.quantum_close(quantum_id=closed_existing.pk, reason="ok")
    path = write(
        tmp_path,
        "mix.yaml",
        f"""\
        - {{ref: done, title: Done in file, status: closed}}
        - {{ref: todo, title: Todo in file}}
        - {{ref: free, title: Free, depends_on: [done, {closed_existing.pk}], comments: [zebra]}}
        - {{ref: held, title: Held, depends_on: [done, todo, {open_existing.pk}]}}
        """,
    )
    _, todo, free, held = quanta_import(path=path)
    assert Quantum.objects.get(pk=held).open_blockers == 2
    ready = [q.pk for q in quanta_ready()]
    assert free in ready and todo in ready and held not in ready
    services.quantum_close(quantum_id=todo, reason="ok")
    services.quantum_close(quantum_id=open_existing.pk, reason="ok")
    assert held in [q.pk for q in quanta_ready()]
    assert [h.quantum.pk for h in quanta_search(query="zebra")] == [free]
