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
    from quanta.search import quanta_search
    from quanta.selectors import quanta_ready

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


# --- hostile files ----------------------------------------------------------------------------


def _refused(path) -> list[str]:
    with pytest.raises(ImportFailed) as exc:
        quanta_import(path=path)
    assert Quantum.objects.count() == 0 and Comment.objects.count() == 0
    return exc.value.problems


def test_it_refuses_a_yaml_bomb_briefly_and_writes_nothing(tmp_path):
    lines = ['- &a {title: "lol", body: "lol"}']
    previous = "a"
    for name in "bcdefghij":
        lines.append(f"- &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 400
    assert _refused(path) == [
        "bomb.yaml:5: aliases would expand the document by more than 10,000 nodes"
    ]


def test_it_stops_reading_dev_zero_at_the_limit(settings):
    settings.IMPORT_MAX_BYTES = 64 * 1024
    from pathlib import Path

    assert _refused(Path("/dev/zero")) == [
        "zero: larger than the import limit of 65,536 bytes (ANNIHILATION_IMPORT_MAX_BYTES)"
    ]


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        ("dupe.yaml", b"- title: one\n  title: two\n", "dupe.yaml:2: key 'title' appears twice (first at line 1)"),
        ("nul.yaml", b"- title: a\n- title: b\x00\n", "nul.yaml:2: contains a NUL byte"),
        ("latin1.jsonl", b'{"title": "a"}\n{"title": "caf\xe9"}\n', "latin1.jsonl:2: not valid UTF-8 (byte 0xe9)"),
        ("escape.yaml", b'- title: "a\\0b"\n', "escape.yaml:1: a value contains a NUL character"),
        ("escape.jsonl", b'{"title": "a\\u0000b"}\n', "escape.jsonl:1: a value contains a NUL character"),
        ("deep.jsonl", b'{"title": ' + b"[" * 5000 + b"]" * 5000 + b"}\n", "deep.jsonl:1: nested deeper than 50 levels"),
        ("date.yaml", b"- title: a\n  body: 2024-02-30\n", "date.yaml:2: cannot read the value '2024-02-30': day is out of range for month"),
    ],
)  # fmt: skip
def test_it_refuses_hostile_bytes_with_file_and_line(tmp_path, name, data, problem):
    path = tmp_path / name
    path.write_bytes(data)
    assert _refused(path) == [problem]


def test_it_never_echoes_a_huge_value_and_refuses_what_the_database_cannot_store(tmp_path):
    huge = "x" * 1_000_000
    path = tmp_path / "huge.jsonl"
    records = [
        {"title": "a", huge: 1},
        {"title": "b", "status": huge},
        {"title": "c", "depends_on": [99999999999999999999]},
        {"title": "d", "comments": [{"author": {"a": 1}, "body": "hi"}]},
        {"title": "e", "comments": [{"author": "x" * 201, "body": "hi"}]},
        {"title": "f", "labels": [huge]},
    ]
    path.write_text(
        "\n".join(json.dumps(r) for r in records) + '\n{"title": "g", "priority": 1e400}'
    )
    problems = _refused(path)
    assert len(problems) == len(records) + 1
    assert all(len(p) < 300 for p in problems), [len(p) for p in problems]
    assert problems[2] == (
        "huge.jsonl:3: depends_on: 99999999999999999999 is not a quantum id (a positive number)"
    )
    assert problems[3] == "huge.jsonl:4: comments: author must be text of up to 200 characters"
    assert problems[6] == "huge.jsonl:7: priority: must be 0..4 (0 = critical), got inf"


BACKLOG = """\
- ref: schema
  title: Design the schema
  labels: [backend]
  comments: [use Postgres]
- title: Build the API
  depends_on: [schema]
"""


def test_importing_the_same_file_twice_updates_instead_of_duplicating(tmp_path):
    from quanta.importer import quanta_import_report

    path = write(tmp_path, "backlog.yaml", BACKLOG)
    first = quanta_import_report(path=path)
    again = quanta_import_report(path=path)

    assert len(first.created) == 2 and first.updated == first.unchanged == []
    assert again.created == [] and again.updated == [] and again.unchanged == first.ids
    assert again.ids == first.ids
    assert Quantum.objects.count() == 2 and Comment.objects.count() == 1
    assert Dependency.objects.count() == 1
    assert again.describe() == "imported 2 quanta: created 0, updated 0, unchanged 2"


def test_a_changed_record_updates_its_quantum_and_a_new_one_is_created(tmp_path):
    from quanta.importer import quanta_import_report

    first = quanta_import_report(path=write(tmp_path, "a.yaml", BACKLOG))
    schema, api = first.ids
    changed = BACKLOG.replace("[backend]", "[backend, db]") + "- title: Write the docs\n"
    changed = changed.replace("comments: [use Postgres]", "comments: [use Postgres, index it]")

    again = quanta_import_report(path=write(tmp_path, "b.yaml", changed))

    assert again.updated == [schema] and again.unchanged == [api]
    assert len(again.created) == 1 and again.ids[:2] == [schema, api]
    assert Quantum.objects.get(pk=schema).labels == ["backend", "db"]
    assert sorted(Comment.objects.filter(quantum_id=schema).values_list("body", flat=True)) == [
        "index it",
        "use Postgres",
    ]
    assert Quantum.objects.get(pk=schema).status == "open"


def test_a_re_import_costs_a_few_statements_whatever_the_number_of_records(
    tmp_path, django_assert_max_num_queries
):
    from quanta.importer import quanta_import_report

    lines = [
        json.dumps(
            {
                "ref": f"r{n}",
                "title": f"task {n}",
                "depends_on": [f"r{n - 1}"] if n else [],
                "comments": [f"note {n}"],
            }
        )
        for n in range(200)
    ]
    path = tmp_path / "backlog.jsonl"
    path.write_text("\n".join(lines) + "\n")
    first = quanta_import_report(path=path)
    lines[7] = json.dumps({"ref": "r7", "title": "task 7", "depends_on": ["r6"],
                           "comments": ["note 7", "one more"]})  # fmt: skip
    path.write_text("\n".join(lines) + "\n")

    # Read what the quanta hold in bulk, then write only what changed (one record's comment).
    with django_assert_max_num_queries(20):
        again = quanta_import_report(path=path)

    assert again.updated == [first.ids[7]] and len(again.unchanged) == 199
    assert Comment.objects.filter(quantum_id=first.ids[7]).count() == 2
    assert Dependency.objects.count() == 199


def test_a_file_of_more_keyed_records_than_a_statement_has_parameters_imports(tmp_path, settings):
    settings.IMPORT_MAX_BYTES = 64 * 2**20
    count = 66_000  # one more parameter per key than the 65,535 a statement may carry
    path = tmp_path / "big.jsonl"
    path.write_text(
        "".join(json.dumps({"ref": f"r{n}", "title": f"t{n}"}) + "\n" for n in range(count))
    )

    ids = quanta_import(path=path)

    assert len(ids) == count and Quantum.objects.count() == count
    assert quanta_import(path=path) == ids  # found again by their keys: nothing duplicated
    assert Quantum.objects.count() == count


def test_a_re_import_keeps_the_status_the_work_gave_it(tmp_path):
    from quanta import services

    path = write(tmp_path, "backlog.yaml", BACKLOG)
    schema, _ = quanta_import(path=path)
    services.quantum_close(quantum_id=schema, reason="done")
    quanta_import(path=path)
    assert Quantum.objects.get(pk=schema).status == "closed"


def test_records_of_one_title_are_each_found_again(tmp_path):
    path = write(tmp_path, "dup.yaml", "- title: Fix it\n- title: Fix it\n  priority: 1\n")
    first = quanta_import(path=path)
    assert quanta_import(path=path) == first and Quantum.objects.count() == 2


def test_two_records_with_one_key_are_refused(tmp_path):
    path = write(tmp_path, "dup.yaml", "- {ref: a, title: A}\n- {key: a, title: B}\n")
    with pytest.raises(ImportFailed) as info:
        quanta_import(path=path)
    assert info.value.problems == ["dup.yaml:2: key: 'a' is already used at dup.yaml:1"]
    assert not Quantum.objects.exists()


def test_an_export_imported_again_changes_nothing(tmp_path, capsys):
    from django.core.management import call_command

    ids = quanta_import(path=write(tmp_path, "backlog.yaml", BACKLOG))
    call_command("quanta", "export")
    exported = write(tmp_path, "export.yaml", capsys.readouterr().out)
    call_command("quanta", "import", str(exported), "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["created"] == [] and report["unchanged"] == ids
