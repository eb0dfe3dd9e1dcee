"""Each table has one module that writes it; other modules and apps call that module.

Checked on the source of the apps (not tests, benchmarks or migrations), for every table of
the apps (OWNERS names each table's writer; a new table must be added). A write is any of:

- an ORM write through the model's manager (`AgentRun.objects.filter(...).update(...)`) or
  through a related manager that yields its rows (`wave.runs.filter(...).update(...)`);
- `.save()` / `.delete()` on a variable known to hold one of its rows: a parameter annotated
  with the model, or a name assigned (or looped over) from an expression that names the model or
  one of its related managers;
- an INSERT / UPDATE / DELETE / COPY in SQL text whose target is the table, spelled out
  (`bursts_agentrun`), as `Model._meta.db_table`, or as the `{table}` placeholder of
  `sql_names(Model)` (or `{<prefix>table}` of `sql_names(Model, "<prefix>")`).

The scan is syntactic: it sees what a reader sees in the module, not what a value turns out to
be at run time.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db import models

from autopilot.models import (
    BaseCheck,
    Finding,
    Goal,
    GoalTransition,
    Hold,
    Hub,
    HubTransition,
    Spend,
)
from bursts.models import AgentRun, Burst, QuantumRun, Wave
from core.models import Event, Session
from operations.models import Alert, AlertTransition, MetricSample
from psychonauts.environments.models import EnvironmentBuild, EnvironmentWaiter
from psychonauts.models import (
    AgentTurn,
    CommandTrauma,
    DiaryEntry,
    Mail,
    Role,
    SandboxIdentity,
    ToolCall,
    Usage,
    Verification,
)
from quanta.models import Comment, Dependency, Quantum
from quanta.pipeline_models import Pipeline, Stage
from reflection.models import (
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleConfidencePoint,
    RuleUse,
    Skill,
    SkillUse,
)
from repos.models import Repository
from tether.models import ChangeReview, Drift, PipelineMutation, Reaching, ReviewDue

ROOT = Path(__file__).resolve().parent.parent
APPS: list[str] = list(settings.PROJECT_APPS)

OWNERS: dict[type[models.Model], str] = {
    Repository: "repos/services.py",
    Session: "psychonauts/runtime/checkpoint.py",
    Event: "core/events.py",
    Quantum: "quanta/services.py",
    Dependency: "quanta/services.py",
    Comment: "quanta/services.py",
    Pipeline: "quanta/pipelines/services.py",
    Stage: "quanta/pipelines/services.py",
    Wave: "bursts/services/waves.py",
    Burst: "bursts/services/bursts.py",
    QuantumRun: "bursts/services/quantum_runs.py",
    AgentRun: "bursts/services/agent_runs.py",
    Role: "psychonauts/roles.py",
    AgentTurn: "psychonauts/runtime/checkpoint.py",
    ToolCall: "psychonauts/runtime/checkpoint.py",
    Usage: "psychonauts/runtime/checkpoint.py",
    Verification: "psychonauts/runtime/verification.py",
    Mail: "psychonauts/runtime/tools.py",
    DiaryEntry: "psychonauts/runtime/diary.py",
    CommandTrauma: "psychonauts/containment/traumas.py",
    SandboxIdentity: "psychonauts/containment/identities.py",
    EnvironmentBuild: "psychonauts/environments/services.py",
    EnvironmentWaiter: "psychonauts/environments/services.py",
    apps.get_model("psychonauts", "Endpoint"): "psychonauts/routing/endpoints.py",
    Reaching: "tether/services/reachings.py",
    Drift: "tether/services/drifts.py",
    ChangeReview: "tether/services/changes.py",
    ReviewDue: "tether/services/changes.py",
    PipelineMutation: "tether/services/mutations.py",
    PlaybookRule: "reflection/services/playbook.py",
    PlaybookDelta: "reflection/services/playbook.py",
    Skill: "reflection/services/skills.py",
    SkillUse: "reflection/services/skills.py",
    ReflectionRun: "reflection/services/runs.py",
    RuleUse: "reflection/services/injection.py",
    RuleConfidencePoint: "reflection/services/playbook.py",
    Goal: "autopilot/services/goals/lifecycle.py",
    GoalTransition: "autopilot/services/goals/lifecycle.py",
    Hub: "autopilot/services/hub.py",
    HubTransition: "autopilot/services/hub.py",
    Spend: "autopilot/services/budgets.py",
    Hold: "autopilot/services/budgets.py",
    Finding: "autopilot/services/scanners.py",
    BaseCheck: "autopilot/services/healing.py",
    apps.get_model("forges", "ForgeRepository"): "forges/services.py",
    apps.get_model("forges", "PullRequest"): "forges/services.py",
    apps.get_model("hooks", "WebhookEndpoint"): "hooks/services/endpoints.py",
    apps.get_model("hooks", "WebhookDelivery"): "hooks/services/outgoing.py",
    apps.get_model("hooks", "OutboxCursor"): "hooks/services/outgoing.py",
    apps.get_model("hooks", "GithubDelivery"): "hooks/services/github.py",
    apps.get_model("hooks", "GithubLink"): "hooks/services/github.py",
    Alert: "operations/services.py",
    AlertTransition: "operations/services.py",
    MetricSample: "operations/services.py",
    apps.get_model("api", "ApiToken"): "api/services.py",
    apps.get_model("api", "IdempotentResponse"): "api/services.py",
}
# Statements that write several apps' tables in one round trip: each belongs to one module, which
# says so in its docstring and is named here with the tables it writes besides its own.
JOINT: dict[str, set[type[models.Model]]] = {
    # the agent loop: a run's claim, phase, counters and end, and each step's events
    "psychonauts/runtime/checkpoint.py": {AgentRun, Event},
    # a run step: a stage's beginning with its attempts and events, a run's end with its events
    "bursts/services/quantum_runs.py": {Event},
}
WRITES = {
    "create",
    "bulk_create",
    "get_or_create",
    "update_or_create",
    "update",
    "bulk_update",
    "delete",
}
SQL_WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|COPY)\s+(\S+)", re.IGNORECASE)


def _accessors(model: type[models.Model]) -> set[str]:
    """The related managers on other models that yield this model's rows (`wave.runs`)."""
    return {
        f.remote_field.get_accessor_name() or ""
        for f in model._meta.fields
        if f.many_to_one and f.remote_field is not None
    } - {""}


ACCESSORS = {model: _accessors(model) for model in OWNERS}


def _mentions(node: ast.AST, model: type[models.Model]) -> bool:
    """Whether an expression names the model or reaches one of its related managers."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == model.__name__:
            return True
        if isinstance(sub, ast.Constant) and sub.value == model.__name__:
            return True  # a string annotation
        if isinstance(sub, ast.Attribute) and sub.attr in ACCESSORS[model]:
            return True
    return False


def _chain(node: ast.AST) -> Iterator[ast.AST]:
    """The receivers of a call chain, outermost first: a.b(...).c(...) -> a.b(...), a.b, a."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        else:
            return
        yield node


def _orm_writes(tree: ast.AST, model: type[models.Model]) -> Iterator[int]:
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr not in WRITES:
            continue
        for receiver in _chain(call.func):
            if not isinstance(receiver, ast.Attribute):
                continue
            by_manager = (
                receiver.attr == "objects"
                and isinstance(receiver.value, ast.Name)
                and receiver.value.id == model.__name__
            )
            if by_manager or receiver.attr in ACCESSORS[model]:
                yield call.lineno
                break


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _instance_writes(tree: ast.AST, model: type[models.Model]) -> Iterator[int]:
    for function in _functions(tree):
        rows: set[str] = set()
        arguments = function.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if arg.annotation is not None and _mentions(arg.annotation, model):
                rows.add(arg.arg)
        for node in ast.walk(function):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign) and _mentions(node.value, model):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                if _mentions(node.annotation, model) or (
                    node.value is not None and _mentions(node.value, model)
                ):
                    targets = [node.target]
            elif isinstance(node, ast.For | ast.comprehension) and _mentions(node.iter, model):
                targets = [node.target]
            for target in targets:
                rows.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("save", "delete")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in rows
            ):
                yield node.lineno


def _sql_texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String constants, and f-strings with each `{expr}` kept as written."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                elif isinstance(value, ast.FormattedValue):
                    parts.append("{" + ast.unparse(value.value) + "}")
            yield node.lineno, "".join(parts)


def _table_spellings(tree: ast.AST, model: type[models.Model]) -> set[str]:
    """How a statement in this module may name the model's table."""
    name = model.__name__
    spellings = {model._meta.db_table, f"{{{name}._meta.db_table}}"}
    for call in ast.walk(tree):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "sql_names"
            and call.args
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id == name
        ):
            prefix = call.args[1] if len(call.args) > 1 else None
            text = str(prefix.value) if isinstance(prefix, ast.Constant) else ""
            spellings.add(f"{{{text}table}}")
        # `.format(table=Model._meta.db_table)`, `{"table": Model._meta.db_table}`
        pairs: list[tuple[object, ast.expr]] = []
        if isinstance(call, ast.Call):
            pairs = [(k.arg, k.value) for k in call.keywords]
        elif isinstance(call, ast.Dict):
            pairs = [
                (k.value, v)
                for k, v in zip(call.keys, call.values, strict=True)
                if isinstance(k, ast.Constant)
            ]
        for key, value in pairs:
            if ast.unparse(value) == f"{name}._meta.db_table":
                spellings.add(f"{{{key}}}")
    return spellings


def _sql_writes(tree: ast.AST, model: type[models.Model]) -> Iterator[int]:
    spellings = {s.lower() for s in _table_spellings(tree, model)}
    for lineno, text in _sql_texts(tree):
        for target in SQL_WRITE.findall(text):
            if target.strip('"(').lower() in spellings:
                yield lineno


def writes_in(path: Path, model: type[models.Model]) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {*_orm_writes(tree, model), *_instance_writes(tree, model), *_sql_writes(tree, model)}
    return sorted(found)


def stray_writes() -> list[str]:
    stray = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            where = path.relative_to(ROOT).as_posix()
            for model, owner in OWNERS.items():
                if where == owner or model in JOINT.get(where, set()):
                    continue
                stray += [f"{where}:{n} writes {model.__name__}" for n in writes_in(path, model)]
    return stray


def test_every_table_of_the_apps_has_an_owner() -> None:
    tables = {
        model
        for app in APPS
        for model in apps.get_app_config(app).get_models()
        if model._meta.managed
    }
    assert tables == set(OWNERS)


def test_it_writes_each_table_from_its_owner_only() -> None:
    assert stray_writes() == []


def test_each_owner_writes_its_table() -> None:
    for model, owner in OWNERS.items():
        assert writes_in(ROOT / owner, model), f"{owner} has no write of {model.__name__}"


def test_each_joint_writer_writes_what_it_declares() -> None:
    for where, models_ in JOINT.items():
        for model in models_:
            assert writes_in(ROOT / where, model), f"{where} has no write of {model.__name__}"


@pytest.mark.parametrize(
    ("source", "model"),
    [
        ("AgentRun.objects.filter(pk=1).update(status='done')", AgentRun),
        ("AgentRun.objects.create(agent_id='a')", AgentRun),
        ("def f(wave):\n    wave.runs.filter(status='running').update(status='error')", QuantumRun),
        ("def f(wave: Wave) -> None:\n    wave.save(update_fields=['stats'])", Wave),
        ("def f(wave):\n    burst = wave.bursts.first()\n    burst.delete()", Burst),
        ("def f(runs):\n    for run in QuantumRun.objects.all():\n        run.save()", QuantumRun),
        ("SQL = 'UPDATE bursts_agentrun SET status = %s'", AgentRun),
        ("SQL = f'INSERT INTO {Session._meta.db_table} (kind) VALUES (%s)'", Session),
        ("_Q = sql_names(QuantumRun, 'r_')\nSQL = 'UPDATE {r_table} SET status = %s'", QuantumRun),
        ("SQL = 'DELETE FROM {t}'.format(t=Burst._meta.db_table)", Burst),
        ("_S = {'table': Session._meta.db_table}\nSQL = 'UPDATE {table} SET x = 1'", Session),
    ],
)
def test_the_check_sees_a_write(tmp_path: Path, source: str, model: type[models.Model]) -> None:
    module = tmp_path / "m.py"
    module.write_text(source + "\n")
    assert writes_in(module, model)


@pytest.mark.parametrize(
    ("source", "model"),
    [
        ("AgentRun.objects.filter(pk=1).values_list('status')", AgentRun),
        ("SQL = 'SELECT 1 FROM bursts_agentrun a JOIN psychonauts_usage u ON true'", AgentRun),
        ("_A = sql_names(AgentRun, 'a_')\nSQL = 'UPDATE {t_table} SET x = 1'", AgentRun),
        ("def f(quantum: Quantum) -> None:\n    quantum.save()", QuantumRun),
    ],
)
def test_the_check_leaves_reads_and_other_tables(
    tmp_path: Path, source: str, model: type[models.Model]
) -> None:
    module = tmp_path / "m.py"
    module.write_text(source + "\n")
    assert writes_in(module, model) == []
