"""Each tether table has one module that writes it; every other module calls that one."""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

WRITERS = {
    "Drift": "tether/services/drifts.py",
    "Reaching": "tether/services/reachings.py",
    "ChangeReview": "tether/services/changes.py",
    "PipelineMutation": "tether/services/mutations.py",
}
WRITES = {
    "create",
    "update",
    "delete",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
}
SOURCE = ["core", "quanta", "bursts", "psychonauts", "tether", "reflection", "annihilation"]


def _manager_of(node: ast.expr) -> str | None:
    """`Model` when the expression is built on `Model.objects` (filter(...).update(...) too)."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if node.attr == "objects" and isinstance(node.value, ast.Name):
                return node.value.id
            node = node.value
        else:
            return None


def writes_in(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
        ):
            model = _manager_of(node.func.value)
            if model in WRITERS:
                found.add(model)
    return found


def test_it_finds_a_write_however_the_query_is_built():
    assert writes_in("Drift.objects.filter(pk=1).exclude(x=2).update(status='x')") == {"Drift"}
    assert writes_in("Reaching.objects.create(question='q')") == {"Reaching"}
    assert writes_in("Drift.objects.filter(pk=1).first()") == set()


def test_each_tether_table_has_one_writer():
    base = Path(settings.BASE_DIR)
    writers: dict[str, set[str]] = {model: set() for model in WRITERS}
    for app in SOURCE:
        for path in (base / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for model in writes_in(path.read_text(encoding="utf-8")):
                writers[model].add(path.relative_to(base).as_posix())
    assert writers == {model: {module} for model, module in WRITERS.items()}
