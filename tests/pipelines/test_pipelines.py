"""Pipelines: YAML validation (file, line, field), loading and versions, matching, the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from quanta.pipeline_models import Pipeline
from quanta.pipelines.conditions import BadCondition, condition_holds
from quanta.pipelines.loader import PipelineInvalid, pipelines_read
from quanta.pipelines.services import (
    DefaultPipelineTaken,
    PipelineNotFound,
    pipeline_match,
    pipeline_snapshot,
    pipelines_load,
    shipped_pipelines_dir,
)
from quanta.services import quantum_create

ROLES = frozenset({"planner", "coder", "reviewer", "tester", "security"})


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, "p.yaml", text)
    with pytest.raises(PipelineInvalid) as exc:
        pipelines_read([path], roles=ROLES)
    return [p.replace(f"{path}:", "p.yaml:") for p in exc.value.problems]


def test_it_names_file_line_and_field_for_every_problem(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """\
name: broken
stages:
  - name: plan
    agents: [wizard]
  - name: empty
    agents: []
  - name: odd
    mode: parallel
    agents: [coder]
  - name: plan
    agents: [coder]
  - name: guarded
    agents: [coder]
    condition: "__import__('os')"
""",
    )
    assert found == [
        "p.yaml:4: stages[0].agents[0]: unknown role 'wizard' (known: coder, planner, reviewer, security, tester)",
        "p.yaml:6: stages[1].agents: empty stage: list at least one agent role",
        "p.yaml:8: stages[2].mode: unknown mode 'parallel' (use sequential or fan_out)",
        "p.yaml:10: stages[3].name: duplicate stage name 'plan' (also stages[0])",
        "p.yaml:14: stages[4].condition: bad condition \"__import__('os')\": Call is not allowed in a condition",
    ]


def test_it_refuses_duplicate_pipeline_names_across_files(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "name: same\nstages: [{name: s, agents: [coder]}]\n")
    b = write(tmp_path, "b.yaml", "\nname: same\nstages: [{name: s, agents: [coder]}]\n")
    with pytest.raises(PipelineInvalid) as exc:
        pipelines_read([a, b], roles=ROLES)
    assert exc.value.problems == [f"{b}:2: name: duplicate pipeline name 'same' (also at {a}:1)"]


def test_it_rejects_conditions_outside_the_language() -> None:
    assert condition_holds(
        "'security' in labels and priority <= 2", {"labels": ["security"], "priority": 1}
    )
    assert not condition_holds("kind != 'chore'", {"kind": "chore"})
    for bad in ("open('x')", "labels.pop()", "x == 1", "1 +", "[c for c in labels]"):
        with pytest.raises(BadCondition):
            condition_holds(bad, {"labels": []})


@pytest.mark.django_db
def test_it_loads_the_shipped_pipelines_with_the_runtime_roles() -> None:
    loaded = pipelines_load(paths=[shipped_pipelines_dir()])
    assert {x.name for x in loaded} >= {"default", "frontend", "security"}
    default = Pipeline.objects.get(is_default=True)
    stages = list(default.stages.order_by("index").values_list("name", "mode"))
    assert stages == [
        ("plan", "sequential"),
        ("implement", "sequential"),
        ("review", "fan_out"),
        ("verify", "sequential"),
    ]


@pytest.mark.django_db
def test_it_bumps_the_version_on_change_and_keeps_old_snapshots(tmp_path: Path) -> None:
    path = write(
        tmp_path, "x.yaml", "name: x\ndefault: true\nstages: [{name: a, agents: [coder]}]\n"
    )
    pipelines_load(paths=[path], roles=ROLES)
    before = pipeline_snapshot(Pipeline.objects.get(name="x"))
    assert pipelines_load(paths=[path], roles=ROLES)[0].change == "unchanged"
    path.write_text("name: x\ndefault: true\nstages: [{name: a, agents: [coder, tester]}]\n")
    [result] = pipelines_load(paths=[path], roles=ROLES)
    assert (result.change, result.version) == ("updated", 2)
    assert before["version"] == 1 and len(before["stages"][0]["agents"]) == 1


@pytest.mark.django_db
def test_it_matches_the_most_specific_pipeline_and_honours_overrides(tmp_path: Path) -> None:
    write(
        tmp_path, "d.yaml", "name: default\ndefault: true\nstages: [{name: a, agents: [coder]}]\n"
    )
    write(
        tmp_path,
        "f.yaml",
        "name: frontend\nmatch: {labels: [frontend]}\nstages: [{name: a, agents: [coder]}]\n",
    )
    write(
        tmp_path,
        "fb.yaml",
        "name: frontend-bug\nmatch: {labels: [frontend], kinds: [bug]}\nstages: [{name: a, agents: [coder]}]\n",
    )
    write(
        tmp_path,
        "s.yaml",
        "name: security\nmatch: {labels: [security]}\nstages: [{name: a, agents: [coder]}]\n",
    )
    write(
        tmp_path,
        "a.yaml",
        "name: appsec\nmatch: {labels: [security]}\nstages: [{name: a, agents: [coder]}]\n",
    )
    pipelines_load(paths=[tmp_path], roles=ROLES)

    def match(**fields: object) -> str:
        return pipeline_match(quantum=quantum_create(title="q", **fields)).name  # type: ignore[arg-type]

    assert match() == "default"
    assert match(labels=["frontend"]) == "frontend"
    assert match(labels=["frontend"], kind="bug") == "frontend-bug"
    assert match(labels=["security"]) == "appsec"  # a tie goes to the first name
    assert match(labels=["frontend"], kind="bug", pipeline="security") == "security"
    with pytest.raises(PipelineNotFound):
        match(pipeline="nope")


@pytest.mark.django_db
def test_the_command_loads_lists_and_shows_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("pipelines", "load", str(shipped_pipelines_dir()), "--json")
    assert json.loads(capsys.readouterr().out)["ok"] is True
    call_command("pipelines", "list", "--json")
    names = [p["name"] for p in json.loads(capsys.readouterr().out)]
    assert names[0] == "default" and "frontend" in names
    call_command("pipelines", "show", "default", "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["stages"][2]["mode"] == "fan_out" and shown["version"] == 1
    bad = write(
        tmp_path,
        "bad.yaml",
        "name: bad\nstages:\n  - name: s\n    mode: nope\n    agents: [coder]\n",
    )
    with pytest.raises(CommandError, match="nothing loaded"):
        call_command("pipelines", "load", str(bad))
    assert f"{bad}:4: stages[0].mode: unknown mode 'nope'" in capsys.readouterr().err


QUICK_DEFAULT = "name: quick\ndefault: true\nstages: [{name: only, agents: [coder]}]\n"


@pytest.mark.django_db
def test_it_refuses_to_replace_the_default_unless_asked(tmp_path: Path) -> None:
    pipelines_load(paths=[shipped_pipelines_dir()], roles=ROLES)
    before = {p.name: (p.version, p.is_default) for p in Pipeline.objects.all()}
    quick = write(tmp_path, "quick.yaml", QUICK_DEFAULT)
    with pytest.raises(DefaultPipelineTaken, match="'quick' would replace 'default'"):
        pipelines_load(paths=[quick], roles=ROLES)
    assert {p.name: (p.version, p.is_default) for p in Pipeline.objects.all()} == before
    # Loading the default itself again (changed or not) replaces nothing.
    assert pipelines_load(paths=[shipped_pipelines_dir()], roles=ROLES)[0].change == "unchanged"

    [loaded] = pipelines_load(paths=[quick], roles=ROLES, replace_default=True)
    assert loaded.change == "created"
    assert list(Pipeline.objects.filter(is_default=True).values_list("name", flat=True)) == [
        "quick"
    ]
    old = Pipeline.objects.get(name="default")
    assert [s.name for s in old.stages.order_by("index")] == [
        "plan",
        "implement",
        "review",
        "verify",
    ]


@pytest.mark.django_db
def test_the_command_needs_replace_default_and_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("pipelines", "load")
    quick = write(tmp_path, "quick.yaml", QUICK_DEFAULT)
    with pytest.raises(CommandError) as exc:
        call_command("pipelines", "load", str(quick))
    assert str(exc.value) == (
        "default: pipeline 'quick' would replace 'default' as the default pipeline; "
        "nothing loaded (--replace-default to replace it)"
    )
    assert exc.value.returncode == 1
    assert not Pipeline.objects.filter(name="quick").exists()
    assert Pipeline.objects.get(is_default=True).name == "default"
    call_command("pipelines", "load", str(quick), "--replace-default")
    assert Pipeline.objects.get(is_default=True).name == "quick"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: a\nname: b\nstages: [{name: s, agents: [coder]}]\n", "p.yaml:2: key 'name' appears twice (first at line 1)"),
        ("name: " + "n" * 101 + "\nstages: [{name: s, agents: [coder]}]\n", "p.yaml:1: name: at most 100 characters"),
        ("name: a\nstages: [{name: s, agents: [coder], retries: 99999999999}]\n", "p.yaml:2: stages[0].retries: must be a whole number 0..2147483647"),
        ("name: a\nmatch: {labels: ['../x']}\nstages: [{name: s, agents: [coder]}]\n", "p.yaml:2: match.labels: '../x' is not a label (letters, digits and _.:/- , starting with a letter or digit, up to 64)"),
        ("name: a\nstages: [{name: s, agents: [{role: coder, model: 2024-01-01}]}]\n", "p.yaml:2: stages[0].agents[0]: settings must be text, numbers, true/false, lists and mappings"),
        ("name: a\n" + "x" * 70 + ": 1\nstages: [{name: s, agents: [coder]}]\n", "p.yaml:2: '" + "x" * 60 + "'… (70 characters): unknown field (known: default, description, match, name, stages)"),
    ],
)  # fmt: skip
def test_it_refuses_what_the_tables_cannot_hold(tmp_path: Path, text: str, problem: str) -> None:
    assert problems(tmp_path, text) == [problem]
