"""A planner's decomposition of a goal: its format, and the checks a plan must pass before any
quantum is filed.

A plan is a JSON object: `{"quanta": [...], "notes": "..."}`, each quantum
`{"key", "title", "body", "acceptance", "verify_commands", "labels", "priority", "complexity",
"depends_on"}` (`depends_on` names other quanta of the plan by key: "wait for these"). The planner
hands it over with the `submit_plan` tool, or as its final answer (the object alone, or in a
```json fence). `plan_parse` lists every problem at once, so that a planner told why its plan was
refused can fix all of it in one more try; `planner_plan_read` finds the plan a finished planner
run left (its last accepted call, else its answer) or says why there is none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autopilot.errors import InvalidPlan
from bursts.models import AgentRun, AgentStatus
from core.safetext import quoted, text_problem
from psychonauts.containment.verify import verify_command_problem
from psychonauts.models import ToolCall
from quanta.errors import InvalidQuantum
from quanta.fields import (
    PROBLEM_MAX,
    TITLE_MAX,
    VERIFY_COMMAND_MAX,
    VERIFY_COMMANDS_MAX,
    clean_label,
)
from quanta.models import PRIORITY_MAX, PRIORITY_MIN, Complexity

PLAN_FIELDS = frozenset({"quanta", "notes"})
QUANTUM_FIELDS = frozenset(
    {
        "key", "title", "body", "acceptance", "verify_commands", "labels", "priority",
        "complexity", "depends_on",
    }
)  # fmt: skip
# Labels that say who filed a quantum and what its spend counts under: the autopilot sets them.
RESERVED_LABEL_PREFIXES = ("autopilot", "goal:", "script:")
KEY_MAX = 64

PLAN_FORMAT = """\
## The plan's format
Call `submit_plan` once with the plan (or, if you cannot, make your final answer the plan alone
as one JSON object). A plan is:

{"quanta": [
   {"key": "a",                     // short, unique in the plan
    "title": "...",                 // one line, what the quantum does
    "body": "...",                  // what to change and where
    "acceptance": "...",            // required: what must be true when it is done
    "verify_commands": ["..."],     // optional: shell commands that pass when it is done
    "labels": ["..."],              // optional
    "priority": 2,                  // optional, 0 (critical) .. 4 (backlog)
    "complexity": "standard",       // optional: trivial | standard | complex
    "depends_on": ["key", ...]}     // optional: quanta of the plan that must be done first
 ],
 "notes": "..."}                    // optional

Every quantum needs a title and acceptance criteria; dependencies must not form a cycle; only
these fields. Verify commands must be commands the command guard allows (no network, no
destructive commands). Labels are letters, digits and _.:/- and may not start with
`autopilot`, `goal:` or `script:`."""


@dataclass(frozen=True)
class PlannedQuantum:
    key: str
    title: str
    body: str
    acceptance: str
    verify_commands: tuple[str, ...]
    labels: tuple[str, ...]
    priority: int | None  # None: the goal's priority
    complexity: str | None  # None: the classifier decides
    depends_on: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    quanta: tuple[PlannedQuantum, ...]
    notes: str = ""

    def in_order(self) -> list[PlannedQuantum]:
        """The quanta with each one after the quanta it depends on (the plan is acyclic)."""
        by_key = {q.key: q for q in self.quanta}
        done: set[str] = set()
        ordered: list[PlannedQuantum] = []

        def visit(q: PlannedQuantum) -> None:
            if q.key in done:
                return
            done.add(q.key)
            for dep in q.depends_on:
                visit(by_key[dep])
            ordered.append(q)

        for q in self.quanta:
            visit(q)
        return ordered


def plan_problems_message(problems: Sequence[str]) -> str:
    return f"the plan has {len(problems)} problem(s):\n" + "\n".join(f"- {p}" for p in problems)


class PlanRefused(InvalidPlan):
    """InvalidPlan with its problems, one per item."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(plan_problems_message(self.problems))


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def plan_text_extract(text: str) -> str:
    """The plan's JSON in a final answer: a ```json fence's content, else the text from its first
    `{` to its last `}`, else the text itself (which then fails to parse, saying so)."""
    fence = _FENCE.search(text)
    if fence:
        return fence.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        return text[start : end + 1]
    return text.strip()


def _text(
    problems: list[str], where: str, value: Any, *, required: bool, limit: int | None = None
) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            problems.append(f"{where}: required, non-empty text")
        return ""
    if not isinstance(value, str):
        problems.append(f"{where}: must be text, got {type(value).__name__}")
        return ""
    problem = text_problem(value)
    if problem is not None:
        problems.append(f"{where}: {problem}")
        return ""
    if limit is not None and len(value.strip()) > limit:
        problems.append(f"{where}: at most {limit} characters (got {len(value.strip())})")
    return value.strip()


def _strings(problems: list[str], where: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where}: must be a list, got {type(value).__name__}")
        return []
    return value


def verify_commands_problems(where: str, commands: Sequence[Any]) -> list[str]:
    """Why these verify commands cannot be kept: each refused one named, with the guard's
    reason."""
    problems: list[str] = []
    if len(commands) > VERIFY_COMMANDS_MAX:
        problems.append(f"{where}: at most {VERIFY_COMMANDS_MAX} commands (got {len(commands)})")
    for i, command in enumerate(commands):
        here = f"{where}[{i}]"
        if not isinstance(command, str) or not command.strip():
            problems.append(f"{here}: a command must be non-empty text")
            continue
        problem = text_problem(command)
        if problem is not None:
            problems.append(f"{here}: {problem}")
            continue
        if len(command) > VERIFY_COMMAND_MAX:
            problems.append(f"{here}: {quoted(command)}: at most {VERIFY_COMMAND_MAX} characters")
            continue

        refusal = verify_command_problem(command)
        if refusal:
            if len(refusal) > PROBLEM_MAX:
                refusal = refusal[:PROBLEM_MAX] + "…"
            problems.append(f"{here}: {quoted(command)} is refused by the command guard: {refusal}")
    return problems


def labels_problems(where: str, labels: Sequence[Any], *, reserved: bool) -> list[str]:
    """Why these labels cannot be kept (each bad one named); `reserved`: refuse the labels the
    autopilot sets itself."""
    problems: list[str] = []
    for i, raw in enumerate(labels):
        try:
            label = clean_label(raw)
        except InvalidQuantum as exc:
            problems.append(f"{where}[{i}]: {exc.problem}")
            continue
        if reserved and label.startswith(RESERVED_LABEL_PREFIXES):
            problems.append(f"{where}[{i}]: {label!r} is reserved for the autopilot")
    return problems


def _cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of `depends_on` edges (its keys, the first repeated at the end), or None.

    Iterative: a hostile plan's long chain must not reach the interpreter's recursion limit."""
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(graph.get(root, ()))]
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if dep not in graph or dep in done:
                continue
            if dep in on_path:
                return [*path[path.index(dep) :], dep]
            path.append(dep)
            on_path.add(dep)
            stack.append(iter(graph.get(dep, ())))
    return None


def _quantum(problems: list[str], i: int, raw: Any) -> tuple[PlannedQuantum | None, list[Any]]:
    where = f"quanta[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be an object, got {type(raw).__name__}")
        return None, []
    for name in sorted(set(raw) - QUANTUM_FIELDS):
        problems.append(
            f"{where}: unknown field {quoted(name)} (known: {', '.join(sorted(QUANTUM_FIELDS))})"
        )
    key_raw = raw.get("key", str(i + 1))
    if isinstance(key_raw, int) and not isinstance(key_raw, bool):
        key_raw = str(key_raw)
    key = _text(problems, f"{where}.key", key_raw, required=True, limit=KEY_MAX)
    title = _text(problems, f"{where}.title", raw.get("title"), required=True, limit=TITLE_MAX)
    body = _text(problems, f"{where}.body", raw.get("body"), required=False)
    acceptance = _text(problems, f"{where}.acceptance", raw.get("acceptance"), required=True)
    commands = _strings(problems, f"{where}.verify_commands", raw.get("verify_commands"))
    problems += verify_commands_problems(f"{where}.verify_commands", commands)
    labels = _strings(problems, f"{where}.labels", raw.get("labels"))
    problems += labels_problems(f"{where}.labels", labels, reserved=True)
    priority = raw.get("priority")
    if priority is not None and (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        problems.append(
            f"{where}.priority: a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, "
            f"got {quoted(priority)}"
        )
        priority = None
    complexity = raw.get("complexity")
    if complexity is not None and complexity not in Complexity.values:
        problems.append(
            f"{where}.complexity: one of {', '.join(Complexity.values)}, got {quoted(complexity)}"
        )
        complexity = None
    depends_on = _strings(problems, f"{where}.depends_on", raw.get("depends_on"))
    quantum = PlannedQuantum(
        key=key,
        title=title,
        body=body,
        acceptance=acceptance,
        verify_commands=tuple(c.strip() for c in commands if isinstance(c, str)),
        labels=tuple(str(label).strip() for label in labels),
        priority=priority,
        complexity=complexity,
        depends_on=(),
    )
    return quantum, depends_on


def plan_check(
    raw: str | dict[str, Any] | list[Any], *, max_quanta: int
) -> tuple[Plan | None, list[str]]:
    """The plan and no problems, or None and every problem found (each naming where it is)."""
    problems: list[str] = []
    data: Any = raw
    if isinstance(raw, str):
        try:
            data = json.loads(plan_text_extract(raw))
        except ValueError as exc:
            return None, [f"not JSON: {exc} (send one JSON object, as the format shows)"]
    if not isinstance(data, dict):
        return None, [
            f"not an object: the plan is a JSON object with `quanta`, got {type(data).__name__}"
        ]
    for name in sorted(set(data) - PLAN_FIELDS):
        problems.append(f"unknown field {quoted(name)} (known: quanta, notes)")
    notes = _text(problems, "notes", data.get("notes"), required=False)
    raw_quanta = data.get("quanta")
    if not isinstance(raw_quanta, list) or not raw_quanta:
        problems.append("quanta: required, a non-empty list of quanta")
        return None, problems
    if len(raw_quanta) > max_quanta:
        problems.append(
            f"quanta: at most {max_quanta} quanta in one plan (got {len(raw_quanta)}); "
            "make each one larger or leave work for a later goal"
        )
    parsed: list[tuple[PlannedQuantum, list[Any], int]] = []
    for i, item in enumerate(raw_quanta):
        quantum, deps = _quantum(problems, i, item)
        if quantum is not None:
            parsed.append((quantum, deps, i))
    keys: dict[str, int] = {}
    for quantum, _, i in parsed:
        if not quantum.key:
            continue
        if quantum.key in keys:
            problems.append(
                f"quanta[{i}].key: {quoted(quantum.key)} is also the key of quanta[{keys[quantum.key]}]"
            )
        else:
            keys[quantum.key] = i
    graph: dict[str, list[str]] = {}
    final: list[PlannedQuantum] = []
    for quantum, deps, i in parsed:
        clean: list[str] = []
        for j, dep in enumerate(deps):
            here = f"quanta[{i}].depends_on[{j}]"
            if isinstance(dep, int) and not isinstance(dep, bool):
                dep = str(dep)
            if not isinstance(dep, str) or dep not in keys:
                problems.append(f"{here}: {quoted(dep)} is not the key of a quantum in the plan")
            elif dep in clean:
                problems.append(f"{here}: {quoted(dep)} is named twice")
            else:
                clean.append(dep)
        if quantum.key:
            graph.setdefault(quantum.key, []).extend(clean)
        final.append(PlannedQuantum(**{**quantum.__dict__, "depends_on": tuple(clean)}))
    cycle = _cycle(graph)
    if cycle is not None:
        problems.append(
            "depends_on: the dependencies form a cycle "
            + " -> ".join(cycle)
            + " (read 'a -> b' as 'a waits on b')"
        )
    if problems:
        return None, problems
    return Plan(quanta=tuple(final), notes=notes), []


def plan_parse(raw: str | dict[str, Any] | list[Any], *, max_quanta: int) -> Plan:
    """The plan, or PlanRefused (an InvalidPlan) listing every problem."""
    plan, problems = plan_check(raw, max_quanta=max_quanta)
    if plan is None:
        raise PlanRefused(problems)
    return plan


# --- a planner run's plan ---------------------------------------------------------------------

SUBMIT_PLAN_TOOL = "submit_plan"


@dataclass(frozen=True)
class PlanReading:
    """What a finished planner run left: a valid plan, or why there is none."""

    plan: Plan | None
    problems: tuple[str, ...]
    source: str  # "tool", "answer" or "" (none)


def planner_plan_read(run: AgentRun, *, max_quanta: int) -> PlanReading:
    """The plan of a planner run that ended: its last successful `submit_plan` call, else its
    final answer (a JSON object, perhaps in a ```json fence); else why there is none (the
    problems of its last refused call, or of its answer)."""
    calls = list(
        ToolCall.objects.filter(agent_run_id=run.pk, name=SUBMIT_PLAN_TOOL, completed=True)
        .order_by("-turn_index", "-id")
        .only("input", "is_error")[:20]
    )
    accepted = next((c for c in calls if not c.is_error), None)
    if accepted is not None:
        plan, problems = plan_check(accepted.input, max_quanta=max_quanta)
        return PlanReading(plan, tuple(problems), "tool")
    answer = run.result or ""
    if "{" in answer:
        plan, problems = plan_check(answer, max_quanta=max_quanta)
        if plan is not None:
            return PlanReading(plan, (), "answer")
        if not calls:
            return PlanReading(None, tuple(problems), "answer")
    ended = (
        f"the planner run ended {run.status}: {run.error.strip()[:500]}"
        if run.status != AgentStatus.DONE
        else ""
    )
    if calls:  # refused calls only: what was wrong with the last one
        _, problems = plan_check(calls[0].input, max_quanta=max_quanta)
        return PlanReading(None, tuple([*([ended] if ended else []), *problems]), "tool")
    if ended:
        return PlanReading(None, (ended, "no plan was submitted"), "")
    _, problems = plan_check(answer, max_quanta=max_quanta)
    return PlanReading(
        None,
        (
            f"no plan: call {SUBMIT_PLAN_TOOL} with the plan, or make your final answer the "
            "plan as one JSON object",
            *problems,
        ),
        "",
    )
