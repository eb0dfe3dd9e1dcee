"""Reading pipeline YAML and checking it: every problem is reported as `file:line: field: why`.

A file holds one pipeline, a list of them, or `pipelines:` followed by a list:

    name: default
    description: plan, implement, review, verify
    default: true                 # catches quanta no other pipeline matches
    match: {labels: [frontend], kinds: [feature, bug]}
    stages:
      - name: plan
        agents: [planner]         # mode defaults to sequential
      - name: review
        mode: fan_out
        agents: [reviewer, {role: security, model: claude-sonnet-4-5}]
        condition: "kind != 'chore'"
        retries: 1                # extra attempts per agent before the stage fails
        timeout: 900              # seconds per agent; 0 = none
      - name: implement
        agents: [coder]
        verify: true              # run the quantum's verify commands after the agents
        verify_retries: 2         # attempts to fix failed checks, 0..5 (default 2)
        verdict: block            # a negative verdict fails the stage (block) or only
                                  # comments on the quantum (comment); default block
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from core.safetext import quoted
from core.safeyaml import InputRefused, LineMap, read_text, yaml_load
from quanta.errors import InvalidQuantum, QuantaError
from quanta.fields import clean_label
from quanta.models import QuantumKind
from quanta.pipeline_models import VERIFY_RETRIES_MAX, StageMode, VerdictPolicy
from quanta.pipelines.conditions import BadCondition, condition_parse
from quanta.pipelines.spec import STAGE_DEFAULTS, AgentSpec, PipelineSpec, StageSpec

PIPELINE_KEYS = {"name", "description", "default", "match", "stages"}
STAGE_KEYS = {
    "name",
    "mode",
    "agents",
    "condition",
    "retries",
    "timeout",
    "verify",
    "verify_retries",
    "verdict",
}
MATCH_KEYS = {"labels", "kinds"}
NAME_MAX = 100  # pipeline and stage names (their columns)
CONDITION_MAX = 500
NUMBER_MAX = 2**31 - 1  # retries and timeout (integer columns)


class PipelineInvalid(QuantaError):
    """Pipeline definitions have problems; `problems` lists each as `file:line: field: why`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


_Node = LineMap  # a YAML mapping that remembers its own line and the line of each key


def _name(key: str) -> str:
    """A key as a message names it: as written when short and printable, else quoted."""
    return key if len(key) <= 60 and key.isprintable() else quoted(key)


class _Problems:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, line: int, field: str, why: str) -> None:
        self.items.append(f"{self.source}:{line}: {field}: {why}")


def _line(node: _Node, key: str) -> int:
    return node.lines.get(key, node.line)


def _str_list(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
        return [v.strip() for v in value]
    return None


def _agent(
    raw: Any, *, where: str, line: int, p: _Problems, roles: Collection[str] | None
) -> AgentSpec | None:
    if isinstance(raw, str):
        role, settings = raw.strip(), {}
    elif isinstance(raw, _Node) and isinstance(raw.get("role"), str):
        role = str(raw["role"]).strip()
        settings = {k: v for k, v in raw.items() if k != "role"}
        line = raw.line
    else:
        p.add(line, where, "an agent is a role name or a mapping with `role:`")
        return None
    if not role:
        p.add(line, where, "role must not be empty")
        return None
    if roles is not None and role not in roles:
        known = ", ".join(sorted(roles)) or "none loaded"
        p.add(line, where, f"unknown role {quoted(role)} (known: {known})")
        return None
    try:
        json.dumps(settings, allow_nan=False)
    except (TypeError, ValueError):  # a date, binary, a set, NaN: nothing a JSON column holds
        p.add(line, where, "settings must be text, numbers, true/false, lists and mappings")
        return None
    return {"role": role, "settings": settings}


def _stage(
    raw: Any, index: int, *, line: int, p: _Problems, roles: Collection[str] | None
) -> StageSpec | None:
    field = f"stages[{index}]"
    if not isinstance(raw, _Node):
        p.add(line, field, "a stage is a mapping with name, agents and optional mode")
        return None
    for key in sorted(set(raw) - STAGE_KEYS):
        p.add(
            _line(raw, key),
            f"{field}.{_name(key)}",
            f"unknown field (known: {', '.join(sorted(STAGE_KEYS))})",
        )
    ok = True
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        p.add(_line(raw, "name"), f"{field}.name", "required, a non-empty string")
        ok = False
    elif len(name.strip()) > NAME_MAX:
        p.add(_line(raw, "name"), f"{field}.name", f"at most {NAME_MAX} characters")
        ok = False
    mode = raw.get("mode", StageMode.SEQUENTIAL)
    if mode not in StageMode.values:
        p.add(
            _line(raw, "mode"),
            f"{field}.mode",
            f"unknown mode {quoted(mode)} (use {' or '.join(StageMode.values)})",
        )
        ok = False
    agents_raw = raw.get("agents")
    agents: list[AgentSpec] = []
    if not isinstance(agents_raw, list) or not agents_raw:
        p.add(_line(raw, "agents"), f"{field}.agents", "empty stage: list at least one agent role")
        ok = False
    else:
        for n, agent_raw in enumerate(agents_raw):
            agent = _agent(
                agent_raw, where=f"{field}.agents[{n}]", line=_line(raw, "agents"), p=p, roles=roles
            )
            if agent is None:
                ok = False
            else:
                agents.append(agent)
    condition = raw.get("condition", "")
    if condition is None:
        condition = ""
    if not isinstance(condition, str):
        p.add(_line(raw, "condition"), f"{field}.condition", "must be a string expression")
        ok = False
    elif len(condition.strip()) > CONDITION_MAX:
        p.add(_line(raw, "condition"), f"{field}.condition", f"at most {CONDITION_MAX} characters")
        ok = False
    elif condition.strip():
        try:
            condition_parse(condition)
        except BadCondition as exc:
            p.add(
                _line(raw, "condition"),
                f"{field}.condition",
                f"bad condition {quoted(condition)}: {quoted(str(exc), 200)[1:-1]}",
            )
            ok = False
    numbers: dict[str, int] = {}
    for key in ("retries", "timeout"):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= NUMBER_MAX:
            p.add(_line(raw, key), f"{field}.{key}", f"must be a whole number 0..{NUMBER_MAX}")
            ok = False
        else:
            numbers[key] = value
    verify = raw.get("verify", STAGE_DEFAULTS["verify"])
    if not isinstance(verify, bool):
        p.add(_line(raw, "verify"), f"{field}.verify", "must be true or false")
        ok = False
    verify_retries = raw.get("verify_retries", STAGE_DEFAULTS["verify_retries"])
    if (
        isinstance(verify_retries, bool)
        or not isinstance(verify_retries, int)
        or not 0 <= verify_retries <= VERIFY_RETRIES_MAX
    ):
        p.add(
            _line(raw, "verify_retries"),
            f"{field}.verify_retries",
            f"must be a whole number 0..{VERIFY_RETRIES_MAX}",
        )
        ok = False
    verdict = raw.get("verdict", STAGE_DEFAULTS["verdict"])
    if verdict not in VerdictPolicy.values:
        p.add(
            _line(raw, "verdict"),
            f"{field}.verdict",
            f"unknown verdict {quoted(verdict)} (use {' or '.join(VerdictPolicy.values)})",
        )
        ok = False
    if not ok:
        return None
    return {
        "index": index,
        "name": str(name).strip(),
        "mode": str(mode),
        "agents": agents,
        "condition": str(condition).strip(),
        "retries": numbers["retries"],
        "timeout_s": numbers["timeout"],
        "verify": bool(verify),
        "verify_retries": int(verify_retries),
        "verdict": str(verdict),
    }


def _pipeline(
    raw: Any, *, line: int, p: _Problems, roles: Collection[str] | None
) -> PipelineSpec | None:
    if not isinstance(raw, _Node):
        p.add(line, "pipeline", "a pipeline is a mapping with name and stages")
        return None
    for key in sorted(set(raw) - PIPELINE_KEYS):
        p.add(
            _line(raw, key),
            _name(key),
            f"unknown field (known: {', '.join(sorted(PIPELINE_KEYS))})",
        )
    ok = True
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        p.add(_line(raw, "name"), "name", "required, a non-empty string")
        ok = False
    elif len(name.strip()) > NAME_MAX:
        p.add(_line(raw, "name"), "name", f"at most {NAME_MAX} characters")
        ok = False
    description = raw.get("description", "") or ""
    if not isinstance(description, str):
        p.add(_line(raw, "description"), "description", "must be a string")
        ok = False
    is_default = raw.get("default", False)
    if not isinstance(is_default, bool):
        p.add(_line(raw, "default"), "default", "must be true or false")
        ok = False
    match = raw.get("match") or _Node()
    labels: list[str] = []
    kinds: list[str] = []
    if not isinstance(match, _Node):
        p.add(_line(raw, "match"), "match", "must be a mapping with labels and/or kinds")
        ok = False
    else:
        for key in sorted(set(match) - MATCH_KEYS):
            p.add(_line(match, key), f"match.{_name(key)}", "unknown field (known: kinds, labels)")
            ok = False
        if "labels" in match:
            got = _str_list(match["labels"])
            if got is None:
                p.add(_line(match, "labels"), "match.labels", "must be a list of labels")
                ok = False
            else:
                for label in got:
                    try:
                        clean_label(label)
                    except InvalidQuantum as exc:
                        p.add(
                            _line(match, "labels"),
                            "match.labels",
                            exc.problem,
                        )
                        ok = False
                labels = sorted(set(got))
        if "kinds" in match:
            got = _str_list(match["kinds"])
            if got is None:
                p.add(_line(match, "kinds"), "match.kinds", "must be a list of kinds")
                ok = False
            else:
                for kind in got:
                    if kind not in QuantumKind.values:
                        p.add(
                            _line(match, "kinds"),
                            "match.kinds",
                            f"unknown kind {quoted(kind)} (known: {', '.join(QuantumKind.values)})",
                        )
                        ok = False
                kinds = sorted(set(got))
    stages_raw = raw.get("stages")
    stages: list[StageSpec] = []
    if not isinstance(stages_raw, list) or not stages_raw:
        p.add(_line(raw, "stages"), "stages", "a pipeline needs at least one stage")
        ok = False
    else:
        seen: dict[str, int] = {}
        for index, stage_raw in enumerate(stages_raw):
            stage = _stage(stage_raw, index, line=_line(raw, "stages"), p=p, roles=roles)
            # Duplicates are checked on the raw name, so an invalid stage still counts.
            name_raw = stage_raw.get("name") if isinstance(stage_raw, _Node) else None
            if isinstance(name_raw, str) and name_raw.strip():
                key = name_raw.strip()
                if key in seen:
                    p.add(
                        _line(stage_raw, "name"),
                        f"stages[{index}].name",
                        f"duplicate stage name {quoted(key)} (also stages[{seen[key]}])",
                    )
                    ok = False
                seen.setdefault(key, index)
            if stage is None:
                ok = False
            else:
                stages.append(stage)
    if not ok:
        return None
    return {
        "name": str(name).strip(),
        "description": str(description).strip(),
        "match_labels": labels,
        "match_kinds": kinds,
        "is_default": bool(is_default),
        "stages": stages,
    }


def pipelines_parse(
    text: str, *, source: str, roles: Collection[str] | None
) -> tuple[list[tuple[int, PipelineSpec]], list[str]]:
    """Parse one file's text: ([(line, spec)], problems). `roles=None` skips the role check."""
    p = _Problems(source)
    try:
        data = yaml_load(text, line_maps=True)
    except InputRefused as exc:
        return [], [exc.where(source)]
    if isinstance(data, _Node) and set(data) == {"pipelines"}:
        data = data["pipelines"]
    items = data if isinstance(data, list) else [data]
    specs: list[tuple[int, PipelineSpec]] = []
    for raw in items:
        line = raw.line if isinstance(raw, _Node) else 1
        spec = _pipeline(raw, line=line, p=p, roles=roles)
        if spec is not None:
            specs.append((line, spec))
    return specs, p.items


def yaml_files(paths: Iterable[Path]) -> list[Path]:
    """Files named by `paths`: a folder contributes its *.yaml and *.yml, sorted."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
        else:
            files.append(path)
    return files


def pipelines_read(
    paths: Iterable[Path], *, roles: Collection[str] | None
) -> list[tuple[str, PipelineSpec]]:
    """Read and check every file; raise PipelineInvalid listing every problem in all of them.

    Returns [(source, spec)]. Duplicate pipeline names and more than one default are problems.
    """
    problems: list[str] = []
    result: list[tuple[str, PipelineSpec]] = []
    names: dict[str, str] = {}
    defaults: list[str] = []
    files = yaml_files(paths)
    if not files:
        raise PipelineInvalid(["no pipeline files found (expected *.yaml)"])
    for path in files:
        try:
            text = read_text(path)
        except InputRefused as exc:
            problems.append(exc.where(str(path)))
            continue
        specs, found = pipelines_parse(text, source=str(path), roles=roles)
        problems += found
        for line, spec in specs:
            where = f"{path}:{line}"
            if spec["name"] in names:
                problems.append(
                    f"{where}: name: duplicate pipeline name {quoted(spec['name'])} (also at {names[spec['name']]})"
                )
                continue
            names[spec["name"]] = where
            if spec["is_default"]:
                defaults.append(where)
            result.append((str(path), spec))
    if len(defaults) > 1:
        problems.append(
            f"{defaults[1]}: default: only one pipeline may be the default (also {defaults[0]})"
        )
    if problems:
        raise PipelineInvalid(problems)
    return result
