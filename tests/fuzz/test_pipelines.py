"""Pipeline YAML, random documents: loaded, or refused with `file:line` problems and nothing
written. Never another exception."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from quanta.pipeline_models import Pipeline, Stage
from quanta.pipelines.loader import PipelineInvalid
from quanta.pipelines.services import DefaultPipelineTaken, pipelines_load, shipped_pipelines_dir
from tests.fuzz.conftest import FUZZ

pytestmark = pytest.mark.django_db

ROLES = frozenset({"planner", "coder", "reviewer", "tester", "security"})

odd = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=12), st.lists(st.text(max_size=4), max_size=2),
    st.sampled_from(["", " ", "x" * 120, "../x", "kind != 'chore'", "__import__('os')", "a\x00"]),
)  # fmt: skip


def mostly(good: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """`good` three times in four, an odd value otherwise."""
    return st.integers(0, 3).flatmap(lambda n: odd if n == 0 else good)


agents = st.lists(
    st.one_of(
        st.sampled_from([*sorted(ROLES), "wizard", ""]),
        st.fixed_dictionaries({"role": st.sampled_from(sorted(ROLES))}, optional={"model": odd}),
        odd,
    ),
    min_size=1,
    max_size=3,
)
stage = st.fixed_dictionaries(
    {"name": mostly(st.sampled_from(["plan", "build", "review"])), "agents": mostly(agents)},
    optional={
        "mode": mostly(st.sampled_from(["sequential", "fan_out", "parallel"])),
        "condition": mostly(st.sampled_from(["kind == 'bug'", "priority < 2", "x("])),
        "retries": mostly(st.integers(-1, 3)),
        "timeout": mostly(st.integers(0, 2**40)),
    },
)
pipeline = st.fixed_dictionaries(
    {
        "name": mostly(st.sampled_from(["fuzz", "fuzz2", "default"])),
        "stages": mostly(st.lists(stage, min_size=1, max_size=3)),
    },
    optional={
        "default": mostly(st.booleans()),
        "description": odd,
        "match": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={"labels": st.lists(odd, max_size=2), "kinds": st.lists(odd, max_size=2)},
            ),
            odd,
        ),
    },
)


def _dump(document: object) -> str:
    try:
        return yaml.safe_dump(document, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        return "name: [unclosed\n"


documents = st.one_of(
    st.one_of(pipeline, st.lists(pipeline, max_size=2)).map(_dump),
    st.text(max_size=200),
)


def snapshot() -> list[tuple[object, ...]]:
    rows = list(Pipeline.objects.order_by("name").values_list("name", "version", "is_default"))
    return [*rows, ("stages", Stage.objects.count())]


@FUZZ
@given(text=documents, replace_default=st.booleans())
def test_any_pipeline_yaml_loads_or_is_refused_with_nothing_written(
    tmp_path: Path, text: str, replace_default: bool
) -> None:
    if not Pipeline.objects.exists():
        pipelines_load(paths=[shipped_pipelines_dir()], roles=ROLES)
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = snapshot()
    try:
        pipelines_load(paths=[path], roles=ROLES, replace_default=replace_default)
    except PipelineInvalid as exc:
        assert all(p.startswith(f"{path}:") for p in exc.problems), exc.problems
        assert all(len(p) < len(str(path)) + 400 for p in exc.problems), exc.problems
        assert snapshot() == before
        event("refused")
    except DefaultPipelineTaken:
        assert not replace_default and snapshot() == before
        event("default kept")
    else:
        event("loaded")
