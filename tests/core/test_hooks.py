"""The one hook type (core.hooks) and how the apps use it: each fills the hooks of the floors
below from its hooks.py alone."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from bursts.executor import EXECUTOR
from bursts.hooks import ON_BURST_CLOSED, ON_RUNS_DRAINED
from core.hooks import Hook, HookEmpty
from psychonauts.runtime.entry import agent_run
from psychonauts.runtime.prompt import PROMPT_SECTIONS
from psychonauts.runtime.tools import TOOLS
from reflection.services.injection import playbook_section
from tests.test_layers import FLOORS, ROOT


def one() -> int:
    return 1


def two() -> int:
    return 2


@dataclass(frozen=True)
class Named:
    name: str
    value: int


def test_it_gives_items_back_in_registration_order_and_each_once() -> None:
    hook: Hook[object] = Hook("test.order")
    hook.register(two)
    hook.register(one)
    hook.register(two)  # a second ready(): same place, not twice

    assert list(hook) == [two, one]
    assert len(hook) == 2 and one in hook


def test_a_keyed_hook_replaces_an_item_in_its_place() -> None:
    hook: Hook[Named] = Hook("test.keyed", key=lambda item: item.name)
    hook.register(Named("a", 1))
    hook.register(Named("b", 2))
    hook.register(Named("a", 3))

    assert list(hook) == [Named("a", 3), Named("b", 2)]
    assert hook.get("a") == Named("a", 3) and hook.get("c") is None
    assert hook.keys() == ("a", "b")


def test_a_single_hook_holds_one_item_and_says_when_it_holds_none() -> None:
    hook: Hook[object] = Hook("test.single", single=True)
    with pytest.raises(HookEmpty, match=r"test\.single"):
        hook.one()
    hook.register(one)
    hook.register(two)

    assert hook.one() is two and list(hook) == [two]


def test_replaced_swaps_the_items_for_a_block_and_brings_them_back() -> None:
    hook: Hook[object] = Hook("test.replaced")
    hook.register(one)

    with hook.replaced(two):
        hook.register(one)  # what the block registers goes with it
        assert list(hook) == [two, one]
    assert list(hook) == [one]

    with pytest.raises(RuntimeError), hook.replaced():
        assert list(hook) == []
        raise RuntimeError
    assert list(hook) == [one]


def test_the_apps_filled_the_hooks_below_them_when_they_loaded() -> None:
    assert EXECUTOR.one() is agent_run
    assert playbook_section in PROMPT_SECTIONS
    assert [hook.__module__ for hook in ON_RUNS_DRAINED] == [
        "psychonauts.hooks",
        "tether.services.drained",
        "reflection.services.injection",
    ]  # the order of INSTALLED_APPS, in every process
    assert [hook.__module__ for hook in ON_BURST_CLOSED] == ["reflection.hooks"]
    assert {"ask_tether", "submit_plan", "read_file"} <= set(TOOLS.keys())


def _ready_body(path: Path) -> list[ast.stmt] | None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "ready":
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # its docstring
            return body
    return None


def test_an_apps_ready_only_imports_its_hooks_module() -> None:
    """Business logic stays out of apps.py: an app plugs into the floors below from its
    hooks.py, which ready() imports. (core, the ground floor, plugs into nothing below.)"""
    wrong = []
    for app in FLOORS[1:]:
        path = ROOT / app / "apps.py"
        if not path.exists():
            continue
        body = _ready_body(path)
        if body is None:
            continue
        imports_hooks = (
            len(body) == 1
            and isinstance(body[0], ast.ImportFrom)
            and body[0].module == app
            and [alias.name for alias in body[0].names] == ["hooks"]
        )
        if not imports_hooks or (ROOT / app / "apps.py").read_text().count("def ") != 1:
            wrong.append(f"{app}/apps.py")
    assert wrong == []


def test_no_app_appends_to_a_registry_of_another() -> None:
    """Every extension point is a Hook: nothing outside an app mutates one of its lists."""
    wrong = []
    for app in FLOORS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("append", "insert", "extend")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id.isupper()
                ):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.value.id}")
    assert wrong == []
