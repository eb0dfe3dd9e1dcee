"""The apps are floors: each imports only the apps below it, never one above.

core (ground floor) < repos < quanta < bursts < psychonauts < tether < reflection < autopilot <
forges < operations < hooks < api < annihilation (the project shell: settings, urls, routing, dashboard, demo). Tests, benchmarks and
migrations are outside the house and may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
# The project's apps, bottom floor first: the one list of them (settings.PROJECT_APPS).
FLOORS: list[str] = list(settings.PROJECT_APPS)


def imports_of(path: Path) -> set[str]:
    """The top-level packages a module imports, wherever in it the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def upward_imports() -> list[str]:
    wrong = []
    for level, app in enumerate(FLOORS):
        above = set(FLOORS[level + 1 :])
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for target in sorted(imports_of(path) & above):
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    return wrong


def test_no_app_imports_one_above_it() -> None:
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tether.models import Drift\nimport quanta.views as v\n")
    assert imports_of(module) >= {"tether", "quanta"}


# --- the seam from the burst manager to the agent runtime -----------------------------------


def module_path(name: str) -> Path | None:
    """The file of a module of the house, or None (a package outside it, a name in a module)."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def module_imports(path: Path) -> set[str]:
    """The house's modules a module imports (`from a.b import c` is a.b, or a.b.c when c is a
    module), wherever in it the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(name for name in names if module_path(name) is not None)
    return found


def reached_by_imports(start: str) -> set[str]:
    """Every module of the house a reader reaches from `start` by following its imports."""
    seen, todo = {start}, [start]
    while todo:
        path = module_path(todo.pop())
        assert path is not None
        for name in module_imports(path) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def registrations(hook_module: str, hook_name: str) -> set[str]:
    """The modules of what is registered in a hook: for each `HOOK.register(item)` in an
    app's code, with HOOK imported from `hook_module`, the module `item` is imported from
    (or the registering module itself, for an item it defines)."""
    found: set[str] = set()
    for app in FLOORS:
        for path in sorted((ROOT / app).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            origin: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        origin[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register"
                    and isinstance(node.func.value, ast.Name)
                    and origin.get(node.func.value.id) == f"{hook_module}.{hook_name}"
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                ):
                    item = origin.get(node.args[0].id)
                    here = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                    found.add(item.rpartition(".")[0] if item else here)
    return found


def test_a_wave_reaches_the_agents_turn_through_imports_and_the_executor_hook() -> None:
    """From `start_wave` a reader follows imports to the stage task and the executor seam,
    then the one registration in that seam to the runtime, whose imports lead to the runner
    that takes the agent's turns (its model call)."""
    from bursts import tasks
    from bursts.executor import EXECUTOR, execute_agent
    from psychonauts.runtime.runner import Runner

    manager = reached_by_imports("bursts.management.commands.start_wave")
    assert {tasks.__name__, execute_agent.__module__} <= manager  # the stage task, the seam
    assert Runner.__module__ not in manager  # the manager never imports the runtime

    runtimes = registrations(execute_agent.__module__, "EXECUTOR")
    assert runtimes == {EXECUTOR.one().__module__}  # what the apps registered as they loaded
    assert Runner.__module__ in reached_by_imports(runtimes.pop())


def task_names() -> dict[str, str]:
    """Every Celery task of the house by name (its decorator's `name`, else module.function),
    with the app that declares it."""
    names: dict[str, str] = {}
    for app in FLOORS:
        for path in sorted((ROOT / app).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.FunctionDef):
                    continue
                for decorator in node.decorator_list:
                    if not isinstance(decorator, ast.Call):
                        continue
                    func = decorator.func
                    called = (
                        func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    )
                    if called not in ("shared_task", "task"):
                        continue
                    name = f"{module}.{node.name}"
                    for keyword in decorator.keywords:
                        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                            name = str(keyword.value.value)
                    names[name] = app
    return names


def test_no_app_sends_a_task_of_an_app_above_it_by_name() -> None:
    """A task name in a string is invisible to imports and to this file's first test: a lower
    app reaches a higher one through a hook, never by naming its task."""
    names = task_names()
    assert names["bursts.stage_agent"] == "bursts"
    assert names["psychonauts.tasks.execute_agent_run"] == "psychonauts"
    wrong = []
    for level, app in enumerate(FLOORS):
        above = set(FLOORS[level + 1 :])
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and names.get(node.value, app) in above
                ):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert wrong == []
