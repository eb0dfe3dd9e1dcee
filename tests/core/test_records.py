"""Records from an import file (core.records): YAML or JSON lines, each with its line, and every
problem an InputRefused with the line it is on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.records import records_read
from core.safeyaml import InputRefused, LineMap

NOT_A_LIST = "expected a list of things (or 'things:' and a list)"


def read(tmp_path: Path, name: str, text: str | bytes, **options: Any) -> list[tuple[int, Any]]:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return records_read(path, key="things", not_a_list=NOT_A_LIST, **options)


def refused(tmp_path: Path, name: str, text: str | bytes, **options: Any) -> InputRefused:
    with pytest.raises(InputRefused) as caught:
        read(tmp_path, name, text, **options)
    return caught.value


def test_it_reads_a_yaml_list_with_the_line_of_each_record_and_field(tmp_path: Path) -> None:
    records = read(tmp_path, "a.yaml", "# things\n- title: one\n\n- title: two\n  size: 3\n")
    assert [(line, dict(raw)) for line, raw in records] == [
        (2, {"title": "one"}),
        (4, {"title": "two", "size": 3}),
    ]
    second = records[1][1]
    assert isinstance(second, LineMap) and second.lines == {"title": 4, "size": 5}


def test_it_reads_the_list_under_its_key(tmp_path: Path) -> None:
    records = read(tmp_path, "a.yml", "things:\n  - title: one\n")
    assert [(line, dict(raw)) for line, raw in records] == [(2, {"title": "one"})]


def test_a_record_that_is_no_mapping_keeps_the_first_line(tmp_path: Path) -> None:
    assert read(tmp_path, "a.yaml", "- just text\n- [1, 2]\n") == [(1, "just text"), (1, [1, 2])]


def test_an_empty_document_has_no_records(tmp_path: Path) -> None:
    assert read(tmp_path, "a.yaml", "") == []
    assert read(tmp_path, "b.yaml", "# nothing yet\n") == []
    assert read(tmp_path, "c.yaml", "things:\n") == []


def test_a_document_that_holds_no_list_is_refused_on_line_one(tmp_path: Path) -> None:
    for text in ("just text\n", "other: [1]\n", "things: 3\n"):
        problem = refused(tmp_path, "a.yaml", text)
        assert (problem.line, problem.why) == (1, NOT_A_LIST)
        assert problem.where("a.yaml") == f"a.yaml:1: {NOT_A_LIST}"


def test_it_reads_json_lines_skipping_blank_ones(tmp_path: Path) -> None:
    text = '{"title": "one"}\n\n   \n{"title": "line\u2028separator"}\n'
    assert read(tmp_path, "a.jsonl", text) == [
        (1, {"title": "one"}),
        (4, {"title": "line\u2028separator"}),  # not split at U+2028
    ]
    assert read(tmp_path, "a.ndjson", text)[1][0] == 4


def test_a_bad_json_line_is_refused_with_its_line(tmp_path: Path) -> None:
    problem = refused(tmp_path, "a.jsonl", '{"title": "one"}\n{"title": \n')
    assert problem.line == 2 and problem.why.startswith("not valid JSON")


def test_json_lines_are_sniffed_only_when_asked_and_only_outside_yaml_suffixes(
    tmp_path: Path,
) -> None:
    text = '{"title": "one"}\n{"title": "two"}\n'
    assert [line for line, _ in read(tmp_path, "a.txt", text, sniff_jsonl=True)] == [1, 2]
    # As YAML, two flow mappings on two lines are not one document.
    assert refused(tmp_path, "b.txt", text).line == 2
    assert refused(tmp_path, "c.yaml", text, sniff_jsonl=True).line == 2


def test_a_file_it_cannot_read_is_refused(tmp_path: Path) -> None:
    assert refused(tmp_path, "a.yaml", b"- a\n- b\x00\n").why == "contains a NUL byte"
    with pytest.raises(InputRefused) as caught:
        records_read(tmp_path / "missing.yaml", key="things", not_a_list=NOT_A_LIST)
    assert caught.value.line == 0 and caught.value.why.startswith("cannot read")
