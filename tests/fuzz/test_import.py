"""The quanta import, random files: ids, or ImportFailed with short `file:line` problems and
nothing written. Never another exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from quanta.errors import ImportFailed
from quanta.importer import quanta_import_report
from quanta.models import Comment, Dependency, Quantum
from tests.fuzz.conftest import FUZZ

pytestmark = pytest.mark.django_db

KEYS = ["ref", "title", "body", "kind", "priority", "labels", "pipeline", "acceptance",
        "verify_commands", "complexity", "status", "close_reason", "parent", "depends_on",
        "part_of", "related", "discovered_from", "comments", "author", "author_kind", "quanta"]  # fmt: skip
SCALARS = ["a", "A", "", "~", "null", "true", "no", "1", "-1", "4", "99999999999999999999",
           "2024-13-45", "1e400", ".nan", "task", "closed", "open", "bug", "'\\0'", '"\\0"',
           '"\\ud800"', "*a", "&a x", "!!binary QUJD", "!!set {a}", "[]", "{}", "[a, b]",
           "{author: x, body: y}", "<<: *a", "? [a]", "|", ">"]  # fmt: skip

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=5)), inner, max_size=4),
    ),
    max_leaves=10,
)


@st.composite
def yaml_texts(draw: st.DrawFn) -> str:
    """YAML-ish lines: records of known and unknown keys, odd scalars, anchors, indentation."""
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        indent = draw(st.sampled_from(["", "  ", "- ", "  - ", "    "]))
        key = draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)))
        value = draw(st.one_of(st.sampled_from(SCALARS), st.text(max_size=10)))
        lines.append(f"{indent}{key}: {value}")
    return "\n".join(lines) + "\n"


# Records close to valid ones, so that many import and the rest fail late (refs, cycles, ids).
field_values = {
    "title": st.one_of(st.text(min_size=1, max_size=20), json_values),
    "body": st.one_of(st.text(max_size=20), json_values),
    "kind": st.sampled_from(["task", "bug", "feature", "epic", "chore", "nope", 3]),
    "priority": st.one_of(st.integers(-2, 6), st.sampled_from([2**70, 1.5, "2", True])),
    "labels": st.lists(st.one_of(st.sampled_from(["ui", "a/b", "../x", "", "x" * 70]), st.text(max_size=8)), max_size=3),
    "status": st.sampled_from(["open", "closed", "deferred", "blocked", "in_progress", ""]),
    "ref": st.sampled_from(["a", "b", "c", "", 1]),
    "depends_on": st.lists(st.sampled_from(["a", "b", "c", 1, 2, 0, -1, 2**70, True]), max_size=3),
    "parent": st.sampled_from(["a", "b", 1, 2**64, None]),
    "comments": st.lists(st.one_of(st.text(max_size=8), st.fixed_dictionaries({"author": json_values, "body": st.text(max_size=8)})), max_size=2),
}  # fmt: skip
records = st.lists(
    st.fixed_dictionaries(
        {"title": field_values["title"]},
        optional={k: v for k, v in field_values.items() if k != "title"},
    ),
    max_size=5,
)


def _yaml(rs: list[dict[str, object]]) -> bytes:
    try:
        return yaml.safe_dump(rs, allow_unicode=True).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, UnicodeEncodeError):
        return b"[]"


files = st.one_of(
    records.map(lambda rs: ("q.yaml", _yaml(rs))),
    records.map(lambda rs: ("q.jsonl", "\n".join(json.dumps(r) for r in rs).encode())),
    yaml_texts().map(lambda t: ("q.yaml", t.encode("utf-8", "surrogatepass"))),
    st.lists(json_values, max_size=4).map(
        lambda rs: ("q.jsonl", "\n".join(json.dumps(r) for r in rs).encode())
    ),
    st.binary(max_size=200).map(lambda b: ("q.yaml", b)),
    st.text(max_size=200).map(lambda t: ("q.yaml", t.encode("utf-8", "surrogatepass"))),
)


@FUZZ
@given(file=files)
def test_any_file_imports_or_is_refused_with_nothing_written(tmp_path: Path, file) -> None:
    name, data = file
    path = tmp_path / name
    path.write_bytes(data)
    before = (Quantum.objects.count(), Comment.objects.count(), Dependency.objects.count())
    try:
        report = quanta_import_report(path=path)
    except ImportFailed as exc:
        assert exc.problems and all(p.startswith(f"{name}:") for p in exc.problems), exc.problems
        assert all(len(p) < 500 for p in exc.problems), exc.problems
        after = (Quantum.objects.count(), Comment.objects.count(), Dependency.objects.count())
        assert after == before
        event("refused")
    else:
        assert Quantum.objects.count() == before[0] + len(report.created)
        event("imported" if report.ids else "empty")
