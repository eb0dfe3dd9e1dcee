"""A stage's verification options: verify, verify_retries, verdict; YAML -> rows -> snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command

from bursts.models import QuantumRun
from bursts.services.stages import stage_spec
from bursts.services.waves import wave_start
from quanta.pipeline_models import Pipeline, Stage
from quanta.pipelines.loader import PipelineInvalid, pipelines_read
from quanta.pipelines.services import pipelines_load, shipped_pipelines_dir
from quanta.services import quantum_create

ROLES = frozenset({"planner", "coder", "reviewer", "tester", "security"})

CHECKED = """\
name: checked
default: true
stages:
  - name: implement
    agents: [coder]
    verify: true
    verify_retries: 3
  - name: review
    agents: [reviewer]
    verdict: comment
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PipelineInvalid) as exc:
        pipelines_read([path], roles=ROLES)
    return [p.replace(f"{path}:", "p.yaml:") for p in exc.value.problems]


@pytest.mark.parametrize(
    ("stage", "problem"),
    [
        ("verify_retries: 9", "p.yaml:5: stages[0].verify_retries: must be a whole number 0..5"),
        ("verify_retries: -1", "p.yaml:5: stages[0].verify_retries: must be a whole number 0..5"),
        ("verify_retries: true", "p.yaml:5: stages[0].verify_retries: must be a whole number 0..5"),
        ("verify_retries: '2'", "p.yaml:5: stages[0].verify_retries: must be a whole number 0..5"),
        ("verdict: maybe", "p.yaml:5: stages[0].verdict: unknown verdict 'maybe' (use block or comment)"),
        ("verdict: [block]", "p.yaml:5: stages[0].verdict: unknown verdict a list of 1 (use block or comment)"),
        ('verify: "yes"', "p.yaml:5: stages[0].verify: must be true or false"),
        ("verify: 1", "p.yaml:5: stages[0].verify: must be true or false"),
    ],
)  # fmt: skip
def test_it_refuses_bad_verification_options_naming_file_line_and_field(
    tmp_path: Path, stage: str, problem: str
) -> None:
    text = f"name: a\nstages:\n  - name: s\n    agents: [coder]\n    {stage}\n"
    assert problems(tmp_path, text) == [problem]


def test_it_reports_every_bad_option_of_a_stage_at_once(tmp_path: Path) -> None:
    text = (
        "name: a\nstages:\n  - name: s\n    agents: [coder]\n"
        "    verify: 'yes'\n    verify_retries: 9\n    verdict: maybe\n"
    )
    assert problems(tmp_path, text) == [
        "p.yaml:5: stages[0].verify: must be true or false",
        "p.yaml:6: stages[0].verify_retries: must be a whole number 0..5",
        "p.yaml:7: stages[0].verdict: unknown verdict 'maybe' (use block or comment)",
    ]


def test_a_stage_without_the_options_gets_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: a\nstages: [{name: s, agents: [coder]}]\n")
    [(_, spec)] = pipelines_read([path], roles=ROLES)
    [stage] = spec["stages"]
    assert (stage["verify"], stage["verify_retries"], stage["verdict"]) == (False, 2, "block")


@pytest.mark.django_db
def test_the_shipped_pipelines_verify_their_implementing_stage() -> None:
    pipelines_load(paths=[shipped_pipelines_dir()], roles=ROLES)
    verified = {
        (s.pipeline.name, s.name, s.verify_retries, s.verdict)
        for s in Stage.objects.select_related("pipeline").filter(verify=True)
    }
    assert verified == {
        ("default", "implement", 2, "block"),
        ("frontend", "implement", 2, "block"),
        ("security", "implement", 2, "block"),
    }


@pytest.mark.django_db
def test_changing_an_option_bumps_the_version(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(CHECKED)
    pipelines_load(paths=[path], roles=ROLES)
    assert pipelines_load(paths=[path], roles=ROLES)[0].change == "unchanged"
    path.write_text(CHECKED.replace("verify_retries: 3", "verify_retries: 0"))
    [loaded] = pipelines_load(paths=[path], roles=ROLES)
    assert (loaded.change, loaded.version) == ("updated", 2)
    path.write_text(CHECKED.replace("verify_retries: 3", "verify_retries: 0").replace(
        "verdict: comment", "verdict: block"
    ))  # fmt: skip
    assert pipelines_load(paths=[path], roles=ROLES)[0].version == 3


@pytest.mark.django_db
def test_the_command_shows_the_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(CHECKED)
    call_command("pipelines", "load", str(path))
    capsys.readouterr()
    call_command("pipelines", "show", "checked", "--json")
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert [(s["verify"], s["verify_retries"], s["verdict"]) for s in stages] == [
        (True, 3, "block"),
        (False, 2, "comment"),
    ]
    call_command("pipelines", "show", "checked")
    header, _, implement, review = capsys.readouterr().out.splitlines()[2:]
    assert header.split()[-2:] == ["verify", "verdict"]
    assert implement.split()[-4:] == ["yes", "(3", "retries)", "block"]
    assert review.split()[-1] == "comment"


@pytest.mark.django_db
def test_a_run_s_snapshot_carries_the_options_whatever_happens_to_the_pipeline_later(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(CHECKED)
    pipelines_load(paths=[path], roles=ROLES)
    quantum = quantum_create(title="Add a greeting")
    wave_start()  # stages are sent on commit, which a test transaction never reaches
    run = QuantumRun.objects.get(quantum=quantum)
    path.write_text(CHECKED.replace("verify: true", "verify: false"))
    pipelines_load(paths=[path], roles=ROLES)
    assert Pipeline.objects.get(name="checked").version == 2
    run.refresh_from_db()
    implement, review = stage_spec(run, 0), stage_spec(run, 1)
    assert (implement["verify"], implement["verify_retries"], implement["verdict"]) == (
        True,
        3,
        "block",
    )
    assert (review["verify"], review["verify_retries"], review["verdict"]) == (False, 2, "comment")
