"""Validation of quantum fields, shared by the services, the import and the CLI.

Each checker takes a raw value (from a form, a CLI flag, a YAML file) and returns the clean value
or raises InvalidQuantum naming the field and what was wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from core.hooks import Hook
from core.redaction import redact
from core.safetext import quoted, text_problem
from quanta.errors import InvalidQuantum
from quanta.models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    Complexity,
    Quantum,
    QuantumKind,
)

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}$")
TITLE_MAX = Quantum._meta.get_field("title").max_length or 500
LABEL_RULE = "letters, digits and _.:/- , starting with a letter or digit, up to 64"


def check_text(field: str, value: str) -> str:
    """`value`, or InvalidQuantum naming `field` when the database could not store it."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidQuantum(problem, field=field)
    return value


def clean_title(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidQuantum("must not be empty", field="title")
    title = check_text("title", value.strip())
    if len(title) > TITLE_MAX:
        raise InvalidQuantum(f"at most {TITLE_MAX} characters (got {len(title)})", field="title")
    return title


def clean_text(field: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise InvalidQuantum("must be text", field=field)
        return check_text(field, value)

    return check


def clean_priority(value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidQuantum("must be an integer 0..4", field="priority")
    try:
        priority = int(value)
    except (TypeError, ValueError):
        raise InvalidQuantum(
            f"must be an integer 0..4, got {quoted(value)}", field="priority"
        ) from None
    except OverflowError:  # float("inf")
        raise InvalidQuantum(
            f"must be 0..4 (0 = critical), got {quoted(value)}", field="priority"
        ) from None
    if isinstance(value, float) and value != priority:
        raise InvalidQuantum(f"must be an integer 0..4, got {quoted(value)}", field="priority")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidQuantum(f"must be 0..4 (0 = critical), got {priority}", field="priority")
    return priority


def clean_choice(field: str, choices: list[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise InvalidQuantum(
                f"must be one of {', '.join(choices)}; got {quoted(value)}", field=field
            )
        return str(value)

    return check


def clean_labels(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise InvalidQuantum("must be a list of labels", field="labels")
    labels: list[str] = []
    for raw in value:
        label = clean_label(raw)
        if label not in labels:
            labels.append(label)
    return labels


def clean_label(value: Any) -> str:
    """One label, as quanta carry them and waves and filters name them."""
    label = (
        str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    )
    if not label or not _LABEL.fullmatch(label):
        raise InvalidQuantum(f"{quoted(value)} is not a label ({LABEL_RULE})", field="labels")
    return label


VERIFY_COMMAND_MAX = 2000  # characters of one verify command
VERIFY_COMMANDS_MAX = 50  # verify commands of one quantum
PROBLEM_MAX = 200  # characters of the guard's reason a message repeats

# Where verify commands are judged before they are saved: the agent runtime, which sits above
# this app and runs them through its command guard, registers the guard here when the apps
# load. `check(command)` returns why the command is refused, or "" when it may run.
CommandCheck = Callable[[str], str]
VERIFY_COMMAND_CHECK: Hook[CommandCheck] = Hook("quanta.verify_command_check", single=True)


def clean_command(value: Any) -> str:
    """One verify command: text a shell runs, that the command guard (when registered) allows."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidQuantum("a command must be non-empty text", field="verify_commands")
    command = check_text("verify_commands", value)
    if len(command) > VERIFY_COMMAND_MAX:
        raise InvalidQuantum(
            f"{quoted(command, 60)}: at most {VERIFY_COMMAND_MAX} characters",
            field="verify_commands",
        )
    problem = next((check(command) for check in VERIFY_COMMAND_CHECK), "")
    if len(problem) > PROBLEM_MAX:  # the guard's reason may repeat a long command
        problem = problem[:PROBLEM_MAX] + "…"
    if problem:
        raise InvalidQuantum(
            f"{quoted(command)} is refused by the command guard: {problem}", field="verify_commands"
        )
    return command


def clean_commands(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise InvalidQuantum("must be a list of commands", field="verify_commands")
    if len(value) > VERIFY_COMMANDS_MAX:
        raise InvalidQuantum(
            f"at most {VERIFY_COMMANDS_MAX} commands (got {len(value)})", field="verify_commands"
        )
    return [clean_command(v) for v in value]


def clean_pipeline(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 100:
        raise InvalidQuantum("must be a pipeline name (up to 100 characters)", field="pipeline")
    return check_text("pipeline", value.strip())


COMPLEXITY_AUTO = "auto"  # what the form, the CLI and an import file say for "classify it"


def clean_complexity(value: Any) -> str | None:
    """A complexity, or None for `auto` (the classifier decides, quanta.complexity)."""
    if value is None or value == COMPLEXITY_AUTO:
        return None
    if value not in Complexity.values:
        choices = ", ".join([*Complexity.values, COMPLEXITY_AUTO])
        raise InvalidQuantum(f"must be one of {choices}; got {quoted(value)}", field="complexity")
    return str(value)


# Fields an operator may set on create and update, each with its checker.
FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    "title": clean_title,
    "body": clean_text("body"),
    "kind": clean_choice("kind", QuantumKind.values),
    "priority": clean_priority,
    "labels": clean_labels,
    "pipeline": clean_pipeline,
    "acceptance": clean_text("acceptance"),
    "verify_commands": clean_commands,
    "complexity": clean_complexity,
}


# Free text from whoever files a quantum (the API, the CLI, an import, a GitHub issue): stored,
# and so shown everywhere, redacted (core.redaction).
_REDACTED_FIELDS = frozenset({"title", "body", "acceptance"})


def clean_fields(values: dict[str, Any]) -> dict[str, Any]:
    """Check every field in `values` (its free text redacted first); raises on the first bad
    one, naming it."""
    cleaned: dict[str, Any] = {}
    for name, value in values.items():
        check = FIELD_CHECKS.get(name)
        if check is None:
            raise InvalidQuantum("not a field of a quantum", field=name)
        if name in _REDACTED_FIELDS and isinstance(value, str):
            value = redact(value)
        cleaned[name] = check(value)
    return cleaned
