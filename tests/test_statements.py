"""Each SQL statement has one owner and is readable whole: no SQL text crosses an app boundary,
and every named statement (`core.sql.Statement`) declares its parameters and plans against the
schema the migrations build.

SQL text crossing a boundary is a name imported from another app that holds a statement or a
piece of one: an SQL string, a `Statement`, a function or method that returns a fragment (named
`*_cte` / `*_sql` / `cte`), or a class that carries either. The one exception is core.sql's
compiler of an INSERT (`rows_insert_cte`), which writes the caller's own model's statement from
that model, as the ORM does: no table, column or parameter of core's is in it.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from core.sql import Statement

ROOT = Path(__file__).resolve().parent.parent
APPS: list[str] = list(settings.PROJECT_APPS)
COMPILERS = {("core.sql", "rows_insert_cte")}
SQL = re.compile(
    r"\b(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|\w+\s+AS\s+\()",
    re.IGNORECASE | re.DOTALL,
)
FRAGMENT_NAME = re.compile(r"(^|_)(cte|sql)$", re.IGNORECASE)


def _carries_sql(value: Any, name: str) -> bool:
    if isinstance(value, Statement):
        return True
    if isinstance(value, str):
        return bool(SQL.search(value))
    if callable(value) and FRAGMENT_NAME.search(name):
        return True
    if isinstance(value, type):
        return any(
            _carries_sql(attr, attr_name)
            for attr_name, attr in vars(value).items()
            if not attr_name.startswith("__")
        ) or any(FRAGMENT_NAME.search(n) for n in vars(value) if not n.startswith("__"))
    if isinstance(value, classmethod | staticmethod):
        return bool(FRAGMENT_NAME.search(name))
    return False


def _app_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in APPS else None


def imported_names(path: Path) -> Iterator[tuple[str, str]]:
    """(module, name) of every `from module import name` of an app's module."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name


def crossings(root: Path = ROOT, apps: list[str] = APPS) -> list[str]:
    found = []
    for app in apps:
        for path in sorted((root / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for module, name in imported_names(path):
                source = _app_of(module)
                if source is None or source == app or (module, name) in COMPILERS:
                    continue
                value = getattr(importlib.import_module(module), name, None)
                if value is not None and _carries_sql(value, name):
                    found.append(f"{path.relative_to(root)} imports {module}.{name}")
    return found


def test_no_sql_text_crosses_an_app_boundary() -> None:
    assert crossings() == []


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("COALESCE((SELECT id FROM session_found), (SELECT id FROM session_opened))", "ID"),
        ("run AS (\n UPDATE t SET x = 1 RETURNING id)", "_RUN"),
        (lambda: "", "agent_run_claim_cte"),
        (type("Batch", (), {"cte": classmethod(lambda cls: "")}), "Batch"),
        (type("Batch", (), {"IDS": "ARRAY(SELECT id FROM events ORDER BY id)"}), "Batch"),
    ],
)
def test_the_check_sees_a_fragment(value: Any, name: str) -> None:
    assert _carries_sql(value, name)


@pytest.mark.parametrize(
    ("value", "name"),
    [("burst:events", "TOPIC"), (lambda: None, "quantum_run_finish"), (dict, "Params")],
)
def test_the_check_leaves_what_is_not_sql(value: Any, name: str) -> None:
    assert not _carries_sql(value, name)


def test_the_check_finds_an_import_of_another_apps_fragment(tmp_path: Path) -> None:
    (tmp_path / "tether").mkdir()
    (tmp_path / "tether" / "m.py").write_text(
        "from core.events import EventParams\nfrom core.sql import Statement, sql_names\n"
        "from psychonauts.runtime.checkpoint import _RUN_CLAIM\n"
    )
    assert crossings(tmp_path, ["tether"]) == [
        "tether/m.py imports psychonauts.runtime.checkpoint._RUN_CLAIM"
    ]


# --- the named statements -----------------------------------------------------------------------


def statements() -> list[Statement[Any]]:
    found: dict[int, Statement[Any]] = {}
    for app in APPS:
        package = importlib.import_module(app)
        for info in pkgutil.walk_packages(package.__path__, f"{app}."):
            if ".migrations" in info.name or ".management" in info.name:
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, Statement):
                    found[id(value)] = value
    return sorted(found.values(), key=lambda s: s.name)


def test_the_hot_paths_statements_are_named() -> None:
    names = {s.name for s in statements()}
    assert {
        "run_claim",
        "turn_open",
        "turn_record",
        "usage_record",
        "turn_complete",
        "run_finish",
        "quantum_run_finish",
        "quantum_run_stage_begin",
        "events_record",
        "goals_ready_to_verify",
        "goals_back_to_active",
    } <= names


@pytest.mark.django_db
def test_every_statement_plans_against_the_schema() -> None:
    """Each statement's tables and columns exist as it spells them: Postgres plans it (EXPLAIN
    runs nothing), every parameter NULL."""
    with connection.cursor() as cursor:
        for statement in statements():
            params = dict.fromkeys(re.findall(r"%\((\w+)\)s", statement.text))
            cursor.execute("EXPLAIN " + statement.text, params)
            assert cursor.fetchall(), statement.name


class _Two(TypedDict):
    a: int
    b: str


def test_a_statement_declares_exactly_the_parameters_it_uses() -> None:
    Statement("ok", "both", _Two, "SELECT %(a)s, %(b)s")
    with pytest.raises(ImproperlyConfigured, match=r"declared but not used \['b'\]"):
        Statement("short", "b unused", _Two, "SELECT %(a)s")
    with pytest.raises(ImproperlyConfigured, match=r"used but not declared \['c'\]"):
        Statement("long", "c undeclared", _Two, "SELECT %(a)s, %(b)s, %(c)s")
