"""The file tools take whatever a model sends: an error result, never an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from psychonauts.runtime.tools import ToolContext, ToolResult, tool_execute
from tests.fuzz.conftest import FUZZ

pytestmark = pytest.mark.django_db

FILE_TOOLS = ["read_file", "write_file", "edit_file", "list_dir", "glob", "grep"]

paths = st.one_of(
    st.sampled_from(["README.md", ".", "", "..", "../..", "/etc/passwd", "a/../../b", ".git/HEAD",
                     "x\x00y", "new/deeper/file.txt", "~", "*", "**/*", "\udcff", "a" * 5000,
                     "README.md/x", "./README.md", "//", "\n"]),
    st.text(max_size=30),
)  # fmt: skip
patterns = st.one_of(
    st.sampled_from(["(a+)+$", "[", "\\", "(?<=x", "a{99999999999}", ".*" * 50, "**", "[!", "\x00"]),
    st.text(max_size=20),
)  # fmt: skip
numbers = st.integers(min_value=-(2**70), max_value=2**70)
anything = st.one_of(
    paths, numbers, st.floats(), st.booleans(), st.none(), st.lists(st.text(max_size=3), max_size=2)
)

# Arguments shaped for each tool (most pass the schema and reach the tool), with now and then a
# key of the wrong type or one the schema does not know.
SHAPES: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "read_file": {"path": paths, "offset": numbers, "limit": numbers},
    "write_file": {"path": paths, "content": st.one_of(st.text(max_size=50), st.just("a\x00b"))},
    "edit_file": {"path": paths, "old": st.text(max_size=10), "new": st.text(max_size=10)},
    "list_dir": {"path": paths},
    "glob": {"pattern": patterns},
    "grep": {"pattern": patterns, "glob": patterns},
}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, object]:
    name = draw(st.sampled_from(FILE_TOOLS))
    shape = SHAPES[name]
    args = {
        key: draw(value)
        for key, value in shape.items()
        if draw(st.booleans()) or key in {"path", "pattern", "content", "old", "new"}
    }
    if draw(st.integers(0, 5)) == 0:
        args[draw(st.sampled_from([*shape, "extra"]))] = draw(anything)
    return name, draw(st.one_of(st.just(args), anything)) if draw(st.integers(0, 9)) == 0 else args


def _ctx(workspace: Path) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id="1_s0_coder", attempt=1, quantum_id=1, role="coder", depth=0,
        workspace=workspace, shared=False,
    )  # fmt: skip


@FUZZ
@given(call=calls())
def test_file_tools_answer_any_arguments_with_a_result(repo: Path, settings, call) -> None:
    settings.PSYCHONAUTS_GREP_TIMEOUT_S = 0.2  # a backtracking pattern fails fast
    name, args = call
    result = tool_execute(_ctx(repo), name, args, FILE_TOOLS)
    assert isinstance(result, ToolResult) and isinstance(result.output, str)
    if isinstance(args, dict) and any("\x00" in v for v in args.values() if isinstance(v, str)):
        assert result.is_error  # a NUL can be neither recorded nor stored
    event(f"{name}: {'error' if result.is_error else 'done'}")
