"""`manage.py playbook` and `manage.py skills`: every subcommand's --json, import errors with
their file and line (all or nothing), exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from reflection.models import DeltaStatus, PlaybookRule, RuleMaturity, Skill
from reflection.services.playbook import delta_propose, rule_create
from reflection.services.skills import skill_create


def run(command: str, *args: str) -> Any:
    out = StringIO()
    call_command(command, *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def text(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=Path(settings.BASE_DIR),
        capture_output=True,
        text=True,
        check=False,
    )


def test_it_adds_lists_and_shows_a_rule(db: Any) -> None:
    added = run(
        "playbook", "add", "Run the tests before finishing", "--role", "coder",
        "--label", "backend", "--scope", "global",
    )  # fmt: skip
    assert added["maturity"] == "candidate" and added["scope"] == "global"
    assert added["roles"] == ["coder"] and added["labels"] == ["backend"]
    listed = run("playbook", "list")
    assert [r["id"] for r in listed] == [added["id"]]
    shown = run("playbook", "show", str(added["id"]))
    assert shown["text"] == "Run the tests before finishing" and shown["deltas"] == []
    assert "Run the tests" in text("playbook", "list")
    assert "confidence" in text("playbook", "show", f"#{added['id']}")


def test_it_lists_by_maturity(db: Any) -> None:
    rule_create(text="a")
    proven = rule_create(text="b")
    PlaybookRule.objects.filter(pk=proven.pk).update(maturity=RuleMaturity.PROVEN)
    assert [r["text"] for r in run("playbook", "list")] == ["b", "a"]
    assert [r["text"] for r in run("playbook", "list", "--maturity", "candidate")] == ["a"]


def test_it_deprecates_a_rule_through_a_grounded_delta(db: Any) -> None:
    rule = rule_create(text="old advice")
    data = run("playbook", "deprecate", str(rule.pk), "--reason", "outdated")
    assert data["maturity"] == "deprecated"
    shown = run("playbook", "show", str(rule.pk))
    assert [(d["op"], d["status"]) for d in shown["deltas"]] == [("deprecate", "grounded")]


def test_it_refuses_an_unknown_rule(db: Any) -> None:
    with pytest.raises(CommandError, match="no rule #999"):
        run("playbook", "show", "999")
    with pytest.raises(CommandError, match="no rule #999"):
        run("playbook", "deprecate", "999")


def test_it_round_trips_export_and_import(db: Any, tmp_path: Path) -> None:
    rule_create(text="Run the tests", roles=["coder"], labels=["x"], scope="global")
    rule_create(text="Skip the tests", kind="anti_pattern")
    paths = []
    for fmt, suffix in (("yaml", ".yaml"), ("jsonl", ".jsonl")):
        exported = run("playbook", "export", "--format", fmt)
        assert exported["count"] == 2 and exported["format"] == fmt
        paths.append(tmp_path / f"rules{suffix}")
        paths[-1].write_text(text("playbook", "export", "--format", fmt))
    for path in paths:
        imported = run("playbook", "import", str(path))
        assert imported["imported"] == 0 and len(imported["unchanged"]) == 2
    texts = sorted(PlaybookRule.objects.values_list("text", "kind", "scope"))
    assert texts.count(("Run the tests", "rule", "global")) == 1
    assert texts.count(("Skip the tests", "anti_pattern", "project")) == 1
    PlaybookRule.objects.all().delete()
    assert run("playbook", "import", str(paths[0]))["imported"] == 2  # a fresh playbook


def test_an_import_finds_its_rules_again_and_revives_no_deprecated_one(
    db: Any, tmp_path: Path
) -> None:
    kept = rule_create(text="Run the tests", roles=["coder"])
    dropped = rule_create(text="Mock the database")
    path = tmp_path / "rules.yaml"
    path.write_text(text("playbook", "export"))
    run("playbook", "deprecate", str(dropped.pk))
    path.write_text(path.read_text().replace("- coder", "- coder\n  - tester"))

    imported = run("playbook", "import", str(path))

    assert imported["imported"] == 0 and imported["ids"] == []
    assert imported["updated"] == [kept.pk] and imported["deprecated"] == [dropped.pk]
    assert PlaybookRule.objects.count() == 2
    assert PlaybookRule.objects.get(pk=dropped.pk).maturity == "deprecated"
    assert PlaybookRule.objects.get(pk=kept.pk).roles == ["coder", "tester"]
    said = text("playbook", "import", str(path)).strip()
    assert said == (
        f"0 rule(s) created, 0 updated, 1 unchanged; 1 already deprecated and left so "
        f"(#{dropped.pk})"
    )


def test_it_imports_all_or_nothing_with_file_and_line(db: Any, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rules:\n"
        "  - text: fine\n"
        "  - text: also fine\n"
        "    kind: sideways\n"
        "  - roles: [coder]\n"
        "    colour: red\n"
    )
    out = StringIO()
    with pytest.raises(CommandError, match="nothing imported"):
        call_command("playbook", "import", str(path), "--json", stdout=out)
    errors = json.loads(out.getvalue())["errors"]
    assert "bad.yaml:4: kind: must be one of rule, anti_pattern" in errors
    assert "bad.yaml:6: colour: unknown field" in errors
    assert "bad.yaml:5: text: required" in errors
    assert not PlaybookRule.objects.exists()


def test_it_reports_a_broken_file_with_its_line(db: Any, tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("playbook", "import", str(path), stdout=StringIO(), stderr=err)
    assert "broken.jsonl:2: not valid JSON" in err.getvalue()
    assert not PlaybookRule.objects.exists()


def test_it_exits_1_on_import_errors_and_2_on_bad_usage(db: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- kind: rule\n")
    result = status("playbook", "import", str(bad))
    assert result.returncode == 1
    assert "bad.yaml:1: text: required" in result.stderr
    for args in (
        ("playbook", "frobnicate"),
        ("playbook", "show", "abc"),
        ("playbook", "add", "x", "--kind", "maybe"),
        ("playbook", "export", "--format", "xml"),
        ("skills", "add", "name"),  # --template is required
        ("skills", "nothing"),
    ):
        result = status(*args)
        assert result.returncode == 2, args
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_it_adds_and_lists_skills(db: Any) -> None:
    added = run("skills", "add", "tdd", "--template", "Write the test first.", "--role", "coder")
    assert added["alpha"] == 1.0 and added["posterior_mean"] == 0.5 and added["uses"] == 0
    assert [s["name"] for s in run("skills", "list")] == ["tdd"]
    with pytest.raises(CommandError, match="exists already"):
        run("skills", "add", "tdd", "--template", "again")
    assert Skill.objects.count() == 1


def test_it_ranks_the_matching_skills_by_the_policy(db: Any, settings: Any) -> None:
    settings.REFLECTION_SKILL_POLICY = "mean"
    good = skill_create(name="good", template="t", roles=["coder"])
    Skill.objects.filter(pk=good.pk).update(alpha=9.0, beta=1.0, uses=8)
    poor = skill_create(name="poor", template="t")
    Skill.objects.filter(pk=poor.pk).update(alpha=1.0, beta=9.0, uses=8)
    skill_create(name="tester-only", template="t", roles=["tester"])
    ranked = run("skills", "rank", "--role", "coder")
    assert ranked["policy"] == "mean"
    assert [s["name"] for s in ranked["skills"]] == ["good", "poor"]
    assert ranked["skills"][0]["score"] == pytest.approx(0.9)
    settings.REFLECTION_SKILL_POLICY = "ucb1"
    skill_create(name="fresh", template="t")
    ranked = run("skills", "rank", "--role", "coder")
    assert ranked["skills"][0]["name"] == "fresh"  # never used: tried first
    assert ranked["skills"][0]["score"] is None
    assert "policy: ucb1" in text("skills", "rank")


def test_it_leaves_a_proposed_delta_to_the_operator(db: Any) -> None:
    delta = delta_propose(op="add", text="new", scope="global")
    assert run("playbook", "list") == []
    assert delta.status == DeltaStatus.PROPOSED
