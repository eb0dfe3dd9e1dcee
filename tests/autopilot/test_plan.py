"""A planner's plan: every problem of a refused plan listed at once, each naming where it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from autopilot.errors import InvalidPlan
from autopilot.plan import PlanRefused, plan_check, plan_parse, plan_text_extract


def q(key: str, **fields: Any) -> dict[str, Any]:
    return {"key": key, "title": f"Do {key}", "acceptance": f"{key} is done", **fields}


def problems_of(raw: Any, *, max_quanta: int = 20) -> list[str]:
    plan, problems = plan_check(raw, max_quanta=max_quanta)
    assert plan is None
    return problems


def test_it_parses_a_valid_plan_in_dependency_order() -> None:
    raw = {
        "quanta": [
            q("docs", depends_on=["api"]),
            q("api", depends_on=["schema"], labels=["api"], priority=1, complexity="complex"),
            q("schema", verify_commands=["pytest -q"], body="the table"),
        ],
        "notes": "three steps",
    }

    plan = plan_parse(raw, max_quanta=20)

    assert [x.key for x in plan.quanta] == ["docs", "api", "schema"]
    assert [x.key for x in plan.in_order()] == ["schema", "api", "docs"]
    api = plan.quanta[1]
    assert (api.labels, api.priority, api.complexity, api.depends_on) == (
        ("api",),
        1,
        "complex",
        ("schema",),
    )
    assert plan.quanta[2].verify_commands == ("pytest -q",)
    assert plan.quanta[0].priority is None and plan.quanta[0].complexity is None
    assert plan.notes == "three steps"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("not a plan", "not JSON"),
        ('{"quanta": [', "not JSON"),
        ("[1, 2]", "not an object"),
        ({"quanta": []}, "quanta: required, a non-empty list"),
        ({"quanta": [q("a")], "extra": 1}, "unknown field 'extra'"),
        ({"quanta": [q("a", owner="me")]}, "quanta[0]: unknown field 'owner'"),
        ({"quanta": [{"key": "a", "acceptance": "x"}]}, "quanta[0].title: required"),
        ({"quanta": [{"key": "a", "title": "x"}]}, "quanta[0].acceptance: required"),
        ({"quanta": [q("a"), q("a")]}, "quanta[1].key: 'a' is also the key of quanta[0]"),
        (
            {"quanta": [q("a", depends_on=["zz"])]},
            "quanta[0].depends_on[0]: 'zz' is not the key of a quantum",
        ),
        ({"quanta": [q("a"), q("b", depends_on=["a", "a"])]}, "'a' is named twice"),
        (
            {
                "quanta": [
                    q("a", depends_on=["b"]),
                    q("b", depends_on=["c"]),
                    q("c", depends_on=["a"]),
                ]
            },
            "the dependencies form a cycle a -> b -> c -> a",
        ),
        ({"quanta": [q("a", depends_on=["a"])]}, "cycle a -> a"),
        ({"quanta": [q(str(i)) for i in range(4)]}, "at most 3 quanta in one plan (got 4)"),
        (
            {"quanta": [q("a", labels=["bad label"])]},
            "quanta[0].labels[0]: 'bad label' is not a label",
        ),
        (
            {"quanta": [q("a", labels=["autopilot:improving"])]},
            "'autopilot:improving' is reserved",
        ),
        ({"quanta": [q("a", priority=7)]}, "quanta[0].priority: a whole number from 0 to 4"),
        ({"quanta": [q("a", priority=True)]}, "quanta[0].priority"),
        ({"quanta": [q("a", complexity="huge")]}, "quanta[0].complexity: one of trivial"),
        (
            {"quanta": [q("a", verify_commands=["pytest -q", "rm -rf /"])]},
            "quanta[0].verify_commands[1]: 'rm -rf /' is refused by the command guard",
        ),
        ({"quanta": [q("a", verify_commands="pytest")]}, "verify_commands: must be a list"),
        ({"quanta": [q("a", title="x\x00y")]}, "quanta[0].title: contains a NUL character"),
        ({"quanta": [q("a", title="t" * 501)]}, "quanta[0].title: at most 500 characters"),
        ({"quanta": ["just a title"]}, "quanta[0]: must be an object"),
    ],
)
def test_it_names_each_kind_of_problem(raw: Any, expected: str) -> None:
    problems = problems_of(raw, max_quanta=3)

    assert any(expected in p for p in problems), problems


def test_it_lists_every_problem_at_once() -> None:
    raw = {
        "quanta": [
            q("a", depends_on=["b"], owner="me"),
            q("b", depends_on=["a"], verify_commands=["rm -rf /"]),
            {"key": "c", "title": "no criteria", "priority": 9, "complexity": "huge"},
            q("d", labels=["no spaces please"], depends_on=["nowhere"]),
        ],
        "extra": True,
    }

    with pytest.raises(InvalidPlan) as caught:
        plan_parse(raw, max_quanta=3)

    assert isinstance(caught.value, PlanRefused)
    problems = caught.value.problems
    for expected in [
        "unknown field 'extra'",
        "quanta: at most 3 quanta",
        "quanta[0]: unknown field 'owner'",
        "quanta[1].verify_commands[0]: 'rm -rf /' is refused",
        "quanta[2].acceptance: required",
        "quanta[2].priority",
        "quanta[2].complexity",
        "quanta[3].labels[0]",
        "quanta[3].depends_on[0]: 'nowhere'",
        "cycle a -> b -> a",
    ]:
        assert any(expected in p for p in problems), (expected, problems)
    assert str(caught.value).startswith(f"the plan has {len(problems)} problem(s):\n- ")


def test_it_reads_a_plan_from_a_final_answer() -> None:
    plan = {"quanta": [q("a")]}
    fenced = f"Here it is:\n\n```json\n{json.dumps(plan)}\n```\nThanks."
    bare = f"My plan: {json.dumps(plan)} -- done"

    assert plan_parse(fenced, max_quanta=5).quanta[0].key == "a"
    assert plan_parse(bare, max_quanta=5).quanta[0].title == "Do a"
    assert plan_text_extract("no braces") == "no braces"


def test_it_survives_a_long_hostile_chain_without_recursing() -> None:
    chain = [q(f"k{i}", depends_on=[f"k{i + 1}"]) for i in range(5000)]
    chain.append(q("k5000", depends_on=["k0"]))

    problems = problems_of({"quanta": chain}, max_quanta=20)

    assert any("at most 20 quanta" in p for p in problems)
    assert any(p.startswith("depends_on: the dependencies form a cycle k0 -> k1") for p in problems)
