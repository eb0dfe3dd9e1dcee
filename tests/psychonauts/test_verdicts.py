"""Reviewing roles end with a structured verdict (report_verdict): it decides their run."""

from __future__ import annotations

import pytest

from core.models import Event
from psychonauts.models import ToolCall
from psychonauts.runtime.execute import agent_run_execute
from quanta.models import AuthorKind, Comment
from tests.psychonauts.stages import staged_run

pytestmark = pytest.mark.django_db

VERDICT = """
name: {name}
match: {{labels: [{name}]}}
turns:
  - tools:
      - report_verdict: {{verdict: {verdict}, reasons: "{reasons}"}}
  - text: "Reviewed."
"""


def test_it_passes_a_reviewer_that_reports_a_pass_verdict(repo, make_run):
    run = make_run("reviewer")  # the shipped `verdict` script

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("VERDICT: PASS\n")
    verdict = Event.objects.get(topic=f"agent:{run.agent_id}", type="verdict")
    assert verdict.payload["verdict"] == "pass"
    assert "no problem found" in verdict.payload["reasons"]


def test_it_fails_an_agent_that_never_calls_the_verdict_tool(repo, make_run, make_quantum, scripts):
    scripts("silent", 'name: silent\nmatch: {labels: [silent]}\nturns:\n  - text: "APPROVE"\n')
    run = make_run("tester", quantum=make_quantum(labels=["silent"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert outcome.error.startswith("no verdict")
    run.refresh_from_db()
    assert run.error.startswith("no verdict")


def test_a_fail_verdict_fails_the_run_with_its_reasons(repo, make_run, make_quantum, scripts):
    scripts("nay", VERDICT.format(name="nay", verdict="fail", reasons="calc.py:2 adds wrongly"))
    run = make_run("security", quantum=make_quantum(labels=["nay"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert (outcome.status, outcome.error) == ("error", "calc.py:2 adds wrongly")
    assert outcome.result.startswith("VERDICT: FAIL\ncalc.py:2 adds wrongly")
    assert not Comment.objects.filter(quantum_id=run.quantum_id).exists()


def test_a_fail_verdict_of_a_commenting_stage_ends_done_with_a_comment(repo, make_quantum, scripts):
    scripts("nay", VERDICT.format(name="nay", verdict="fail", reasons="the docs lag behind"))
    quantum = make_quantum(labels=["nay"])
    run = staged_run(quantum, "reviewer", verdict="comment")

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    comment = Comment.objects.get(quantum=quantum)
    assert comment.author == run.agent_id
    assert comment.author_kind == AuthorKind.PSYCHONAUT
    assert "the docs lag behind" in comment.body


def test_it_refuses_hostile_verdicts_with_a_tool_error_and_takes_a_retry(
    repo, make_run, make_quantum, scripts
):
    scripts(
        "hostile",
        """
name: hostile
match: {labels: [hostile]}
turns:
  - tools:
      - report_verdict: {verdict: maybe, reasons: "unsure"}
      - report_verdict: {verdict: pass, reasons: 5}
      - report_verdict: {verdict: [pass], reasons: "a list"}
      - report_verdict: {verdict: fail, reasons: "%s"}
      - report_verdict: {verdict: pass}
      - report_verdict: {verdict: fail, reasons: "   "}
      - report_verdict: {verdict: pass, reasons: "ok", extra: 1}
  - tools:
      - report_verdict: {verdict: pass, reasons: "looked again: fine"}
  - text: "Done."
"""
        % ("x" * 9000),
    )
    run = make_run("reviewer", quantum=make_quantum(labels=["hostile"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert outcome.result.startswith("VERDICT: PASS\nlooked again: fine")
    refused = list(
        ToolCall.objects.filter(agent_run=run, turn_index=0).order_by("id").values_list(
            "is_error", "output"
        )
    )  # fmt: skip
    assert all(is_error for is_error, _ in refused)
    outputs = [output for _, output in refused]
    assert "must be one of ['pass', 'fail']" in outputs[0]
    assert "reasons" in outputs[1] and "string" in outputs[1]
    assert "verdict" in outputs[2]
    assert "at most 8000 characters" in outputs[3]
    assert "reasons" in outputs[4]
    assert "must not be blank" in outputs[5]
    assert "extra" in outputs[6]
