"""The apps are floors: each imports only the apps below it, never one above.

core (ground floor) < repos < quanta < bursts < psychonauts < tether < reflection < autopilot <
operations < hooks < api < annihilation (the project shell: settings, urls, routing, dashboard, demo). Tests, benchmarks and
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
