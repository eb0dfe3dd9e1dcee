"""The one reader of YAML and JSON from outside: limits, refusals, and short messages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core import safeyaml
from core.safeyaml import InputRefused, json_load, read_bytes, read_text, yaml_load


def billion_laughs() -> str:
    """The classic: ten levels of nine aliases each, 10**9 strings once expanded, ~350 bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefghij":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = name
    return "\n".join(lines) + "\n"


def refused(text: str) -> InputRefused:
    with pytest.raises(InputRefused) as exc:
        yaml_load(text, line_maps=True)
    return exc.value


def test_it_refuses_a_billion_laughs_fast_and_briefly():
    text = billion_laughs()
    assert len(text.encode()) < 400
    start = time.monotonic()
    problem = refused(text)
    assert time.monotonic() - start < 0.5
    assert problem.where("bomb.yaml") == (
        "bomb.yaml:5: aliases would expand the document by more than 10,000 nodes"
    )


def test_it_allows_a_few_aliases_and_merge_keys():
    data = yaml_load(
        "base: &base {agents: [coder], retries: 1}\n"
        "stages:\n"
        "  - {<<: *base, name: one}\n"
        "  - {<<: *base, name: two, retries: 2}\n",
        line_maps=True,
    )
    assert [s["retries"] for s in data["stages"]] == [1, 2]
    assert data["stages"][1].lines["name"] == 4


def test_it_refuses_more_aliases_than_its_budget():
    text = "a: &a x\nb: [" + ", ".join(["*a"] * (safeyaml.MAX_ALIASES + 1)) + "]\n"
    assert refused(text).why == f"more than {safeyaml.MAX_ALIASES} aliases (*name)"


def test_it_refuses_an_alias_inside_the_node_it_names():
    assert refused("- &loop [1, *loop]\n").why == "alias *loop is inside the node it names"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("x:\n  " + "[" * 10_000 + "]" * 10_000 + "\n", 2),
        ("".join(f"{'  ' * i}k{i}:\n" for i in range(60)) + f"{'  ' * 60}v\n", 50),
    ],
)
def test_it_refuses_deep_nesting(text, line):
    problem = refused(text)
    assert problem.why == f"nested deeper than {safeyaml.MAX_DEPTH} levels"
    assert problem.line == line


def test_it_refuses_documents_of_too_many_nodes(monkeypatch):
    monkeypatch.setattr(safeyaml, "MAX_NODES", 100)
    yaml_load("[" + ", ".join(["x"] * 98) + "]")
    assert "more than 100 YAML nodes" in refused("[" + ", ".join(["x"] * 100) + "]").why


def test_it_refuses_a_key_that_appears_twice_with_both_lines():
    problem = refused("- title: one\n  body: text\n  title: two\n")
    assert problem.where("q.yaml") == "q.yaml:3: key 'title' appears twice (first at line 1)"


def test_it_refuses_values_no_constructor_can_make():
    assert refused("a: 2024-13-45\n").why == (
        "cannot read the value '2024-13-45': month must be in 1..12"
    )
    assert refused("a: " + "1" * 5000 + "\n").why.startswith("cannot read the value '1111")
    assert len(refused("a: " + "1" * 5000 + "\n").why) < 300


def test_it_refuses_nul_and_invalid_utf8_with_the_line(tmp_path):
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"a: 1\nb: x\x00y\n")
    with pytest.raises(InputRefused) as exc:
        read_text(nul)
    assert exc.value.where("nul.yaml") == "nul.yaml:2: contains a NUL byte"
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"a: 1\n\nb: caf\xe9\n")
    with pytest.raises(InputRefused) as exc:
        read_text(latin1)
    assert exc.value.where("latin1.yaml") == "latin1.yaml:3: not valid UTF-8 (byte 0xe9)"
    # Escapes make the same characters inside quotes.
    assert refused('a: "x\\0y"\n').why == "a value contains a NUL character"
    assert refused('a: "\\ud800"\n').why == "a value is not valid UTF-8"


def test_it_stops_reading_at_the_size_limit(settings, tmp_path):
    settings.IMPORT_MAX_BYTES = 1024
    start = time.monotonic()
    with pytest.raises(InputRefused) as exc:
        read_bytes(Path("/dev/zero"))
    assert time.monotonic() - start < 0.5
    assert exc.value.where("zero") == (
        "zero: larger than the import limit of 1,024 bytes (ANNIHILATION_IMPORT_MAX_BYTES)"
    )
    exact = tmp_path / "exact.yaml"
    exact.write_bytes(b"#" * 1024)
    assert len(read_bytes(exact)) == 1024
    exact.write_bytes(b"#" * 1025)
    with pytest.raises(InputRefused):
        read_bytes(exact)


def test_it_says_why_a_file_cannot_be_read(tmp_path):
    with pytest.raises(InputRefused, match="cannot read: No such file or directory"):
        read_bytes(tmp_path / "missing.yaml")
    with pytest.raises(InputRefused, match="cannot read: Is a directory"):
        read_bytes(tmp_path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": ', "not valid JSON: Expecting value"),
        ("[" * 100_000 + "]" * 100_000, f"nested deeper than {safeyaml.MAX_DEPTH} levels"),
        ("[" * 60 + "]" * 60, f"nested deeper than {safeyaml.MAX_DEPTH} levels"),
        ('{"title": "a\\u0000b"}', "a value contains a NUL character"),
        ('{"title": "\\udc80"}', "a value is not valid UTF-8"),
        ("1" * 5000, "not valid JSON: a number with too many digits"),
    ],
)
def test_json_gets_the_same_limits(text, why):
    with pytest.raises(InputRefused) as exc:
        json_load(text, line=7)
    assert exc.value.line == 7 and exc.value.why == why
