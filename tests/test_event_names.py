"""Events are a contract: each app declares its event names (bursts/events.py, tether/events.py,
...), in one tense, and publishers pass those names rather than spelling them to core.events."""

from __future__ import annotations

import ast
import re
from enum import StrEnum
from pathlib import Path
from typing import get_args

from django.conf import settings

from autopilot import events as autopilot_events
from bursts.events import BurstEventType
from hooks.events import SOURCES
from operations.events import AlertEventType
from psychonauts.events import AGENT_EVENT_TYPES, EnvironmentEventType
from quanta.events import QuantaEventType
from reflection.events import ReflectionEventType
from tether.events import TetherEventType

ROOT = Path(__file__).resolve().parent.parent
CORE_PUBLISHERS = {"publish": 1, "publish_many": 1}


def declared() -> set[str]:
    names: set[str] = set(AGENT_EVENT_TYPES)
    for enum in (BurstEventType, TetherEventType, AlertEventType):
        assert issubclass(enum, StrEnum)
        names.update(enum)
    for literal in (QuantaEventType, ReflectionEventType, EnvironmentEventType):
        names.update(get_args(literal))
    for name in dir(autopilot_events):
        if name.endswith("EventType"):
            names.update(get_args(getattr(autopilot_events, name)))
    return names


def spelled_to_core(path: Path, root: Path = ROOT) -> list[str]:
    """Calls of core.events' publish / publish_many whose event names are string literals."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in CORE_PUBLISHERS or len(node.args) <= CORE_PUBLISHERS[name]:
            continue
        arg = node.args[CORE_PUBLISHERS[name]]
        literals = [arg] if name == "publish" else [
            e.elts[0] for e in getattr(arg, "elts", []) if isinstance(e, ast.Tuple) and e.elts
        ]  # fmt: skip
        for item in literals:
            if isinstance(item, ast.Constant | ast.JoinedStr):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(item)}")
    return found


def test_no_publisher_spells_an_event_name_to_core() -> None:
    wrong = []
    for app in settings.PROJECT_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts and path != ROOT / "core" / "events.py":
                wrong.extend(spelled_to_core(path))
    assert wrong == []


def test_the_check_sees_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "publish('quanta', 'quantum_made', {})\npublish_many(T, [('x', {})])\n"
        "publish(T, f'pipeline_{change}', {})\npublish(T, Names.MADE, {})\n"
    )
    assert [line.split(": ", 1)[1] for line in spelled_to_core(module, tmp_path)] == [
        "'quantum_made'", "'x'", "f'pipeline_{change}'"
    ]  # fmt: skip


# Names that say what happened in the present, or what is about to: `wave_start`, `run_complete`.
PRESENT = re.compile(r"_(start|complete|create|close|open|merge|fire|check|drift|stage|init)$|ing$")
# The statuses an agent's execution ends in name its last event, as the run's status does.
STATUSES = {"waiting"}


def test_the_names_are_in_one_tense() -> None:
    assert sorted(n for n in declared() - STATUSES if PRESENT.search(n)) == []


def test_the_webhooks_map_declared_names() -> None:
    legacy = {"wave_complete", "alert_firing"}  # rows of an earlier release
    assert {name for _, name in SOURCES} - legacy <= declared()
