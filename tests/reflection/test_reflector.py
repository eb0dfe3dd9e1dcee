"""The reflector: a model reads each quantum run's sessions and writes its agents' diaries;
malformed answers are recorded and skipped; the Tether's rejections become findings; the
scripted provider's `choose` turns that let an offline agent follow what its prompt says."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from bursts.models import AgentRun, Burst, QuantumRun
from core.events import publish
from core.models import Event, Session
from psychonauts.errors import InvalidDefinition
from psychonauts.models import DiaryEntry
from psychonauts.routing.providers.base import ProviderRequest, RunInfo
from psychonauts.routing.providers.scripted import ScriptedProvider, script_parse
from quanta.services import quantum_create
from reflection import extraction, pipeline, reflector
from reflection.models import PlaybookDelta, PlaybookRule, ReflectionRun
from tether.models import ChangeReview, ChangeStatus, Drift, DriftStatus

pytestmark = pytest.mark.django_db

VERDICT = "The coder handed over the change before running the tests: no test run was recorded."
LESSON = (
    "Run the tests before handing over the change, so that a test run is recorded for the tester."
)


def quantum_run(burst: Burst, *labels: str) -> QuantumRun:
    quantum = quantum_create(title="Add the export", labels=list(labels))
    return QuantumRun.objects.create(
        wave_id=burst.wave_id, burst=burst, quantum=quantum, pipeline_name="test"
    )


def agent(
    run: QuantumRun, role: str, stage: int, *events: tuple[str, dict[str, Any]], **kw: Any
) -> AgentRun:
    made = AgentRun.objects.create(
        agent_id=f"{run.quantum_id}_s{stage}_{role}",
        quantum=run.quantum,
        quantum_run=run,
        role=role,
        stage_index=stage,
        status=kw.pop("status", "done"),
        **kw,
    )
    session = Session.objects.create(kind="agent_run", ref=str(made.pk), title=made.agent_id)
    for kind, payload in events:
        publish(f"agent:{made.agent_id}", kind, payload, session_id=session.pk)
    return made


def failed_review(burst: Burst) -> tuple[AgentRun, AgentRun]:
    """A coder that skipped the tests and the tester that failed it for that."""
    run = quantum_run(burst, "demo")
    coder = agent(
        run,
        "coder",
        1,
        ("text", {"text": "Handing it over without running the tests."}),
        ("tool_call", {"name": "write_file", "input": {"path": "src/a.py"}}),
        ("committed", {"sha": "abc123"}),
    )
    tester = agent(
        run,
        "tester",
        2,
        ("tool_call", {"name": "shell", "input": {"command": "test -f notes/x"}}),
        ("tool_result", {"name": "shell", "output": "no test run", "is_error": False}),
        ("verdict", {"verdict": "fail", "reasons": VERDICT}),
        status="error",
        error=VERDICT,
        result=f"VERDICT: FAIL\n{VERDICT}",
    )
    return coder, tester


def scripts(tmp_path: Path, settings: Any, body: str) -> None:
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    (folder / "reflector-test.yaml").write_text(body)
    settings.PSYCHONAUTS_SCRIPT_DIRS = [*settings.PSYCHONAUTS_SCRIPT_DIRS, str(folder)]


def reflector_plays(tmp_path: Path, settings: Any, turn: str) -> None:
    """The reflector of quanta labelled `odd` plays this one turn (YAML)."""
    scripts(
        tmp_path,
        settings,
        f"name: reflector-test\nmatch: {{roles: [reflector], labels: [odd]}}\nturns:\n  - {turn}\n",
    )


# --- the reflector --------------------------------------------------------------------------


def test_the_transcript_holds_each_agents_session_in_order(burst: Burst) -> None:
    coder, tester = failed_review(burst)
    assert coder.quantum_run is not None
    text = reflector.transcript(coder.quantum_run, [coder, tester])
    assert text.index("role coder") < text.index("role tester")
    assert 'called write_file {"path": "src/a.py"}' in text
    assert "shell returned: no test run" in text
    assert f"verdict fail: {VERDICT}" in text


def test_the_transcript_reads_the_sessions_of_all_its_agents_at_once(
    burst: Burst, django_assert_num_queries: Any
) -> None:
    coder, tester = failed_review(burst)
    assert coder.quantum_run is not None
    run = QuantumRun.objects.select_related("quantum").get(pk=coder.quantum_run.pk)
    with django_assert_num_queries(2):  # the sessions, then their events
        both = reflector.transcript(run, [coder, tester])
    with django_assert_num_queries(2):
        one = reflector.transcript(run, [coder])
    assert both.startswith(one) and "role tester" in both and "role tester" not in one


def test_the_reflector_writes_the_diary_of_the_agent_its_lesson_is_for(burst: Burst) -> None:
    coder, tester = failed_review(burst)
    done = reflector.reflect_sessions(burst.pk, reflection_run_id=0)
    assert (done.quantum_runs, done.entries, done.errors, done.skipped) == (1, 2, 0, 0)
    learned = DiaryEntry.objects.get(kind="learning")
    assert (learned.agent_run_id, learned.text, learned.source) == (coder.pk, LESSON, "reflector")
    assert DiaryEntry.objects.get(kind="accomplishment").agent_run_id == tester.pk

    again = reflector.reflect_sessions(burst.pk, reflection_run_id=0)
    assert (again.quantum_runs, DiaryEntry.objects.count()) == (0, 2)  # read once


def test_a_quantum_run_with_nothing_to_learn_gets_no_entry(burst: Burst) -> None:
    run = quantum_run(burst)
    agent(run, "coder", 1, ("text", {"text": "All done."}))
    done = reflector.reflect_sessions(burst.pk, reflection_run_id=0)
    assert (done.quantum_runs, done.entries) == (1, 0)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("I think the coder should test more.", "the answer is not JSON"),
        ("[1, 2]", 'not an object with a list of "entries"'),
        ('{"entries": "none"}', 'not an object with a list of "entries"'),
        ("x" * 40_000, "more than 32000"),
        ('{"entries": [{"role": "coder", "kind": "learning"}]}', "entries[0].text: empty"),
        ('{"entries": [{"role": "coder", "kind": "wisdom", "text": "t"}]}', "entries[0].kind"),
        (
            '{"entries": [{"role": "coder", "kind": "learning", "text": "t", "rank": 1}]}',
            "unknown field 'rank'",
        ),
        (
            '{"entries": [{"role": "pilot", "kind": "learning", "text": "Fly"}]}',
            "'pilot' did not work on this run",
        ),
        ('{"entries": [{"kind": "learning", "text": "No evidence"}]}', "entries[0].role: None"),
        (
            '{"entries": [{"role": "coder", "kind": "learning", "text": "' + "y" * 600 + '"}]}',
            "600 characters",
        ),
    ],
)
def test_a_malformed_answer_is_recorded_and_skipped(
    burst: Burst, tmp_path: Path, settings: Any, answer: str, problem: str
) -> None:
    reflector_plays(tmp_path, settings, f"text: {json.dumps(answer)}")
    run = quantum_run(burst, "odd")
    agent(run, "coder", 1, ("text", {"text": "done"}))
    done = reflector.reflect_sessions(burst.pk, reflection_run_id=7)
    assert (done.entries, done.skipped) == (0, 1)
    assert problem in done.problems[0]
    recorded = Event.objects.get(topic="reflection:extracting", type="reflector_skipped")
    assert recorded.payload["reflection_run"] == 7 and problem in recorded.payload["problem"]
    assert not DiaryEntry.objects.exists()


def test_good_entries_of_a_partly_bad_answer_are_kept_and_fenced_json_is_read(
    burst: Burst, tmp_path: Path, settings: Any
) -> None:
    answer = (
        "```json\n"
        '{"entries": [{"role": "coder", "kind": "decision", "text": "Kept the old API."},'
        ' {"role": "coder", "kind": "mood", "text": "tired"}]}\n```'
    )
    reflector_plays(tmp_path, settings, f"text: {json.dumps(answer)}")
    run = quantum_run(burst, "odd")
    coder = agent(run, "coder", 1)
    done = reflector.reflect_sessions(burst.pk, reflection_run_id=0)
    assert (done.entries, done.skipped) == (1, 1)
    assert DiaryEntry.objects.get().agent_run_id == coder.pk


def test_a_failing_reflector_is_recorded_and_the_run_completes(
    burst: Burst, tmp_path: Path, settings: Any
) -> None:
    reflector_plays(tmp_path, settings, "fail: overloaded")
    run = quantum_run(burst, "odd")
    agent(run, "coder", 1)
    reflected, _ = pipeline.reflect_burst(burst.pk)
    assert reflected is not None and reflected.status == "completed", reflected
    assert (reflected.counts["reflector_errors"], reflected.counts["sessions_read"]) == (1, 0)
    problem = Event.objects.get(type="reflector_skipped").payload["problem"]
    assert "the reflector failed: overloaded" in problem


def test_the_pipeline_turns_the_reflectors_lesson_into_a_rule_for_the_coder(
    burst: Burst,
) -> None:
    coder, _ = failed_review(burst)
    failed_review(burst)  # a second session supports the lesson
    run, _ = pipeline.reflect_burst(burst.pk)
    assert run is not None
    assert run.status == "completed", run.error
    assert (run.counts["sessions_read"], run.counts["diary_entries"]) == (2, 4)
    rule = PlaybookRule.objects.get(text=LESSON)
    assert (rule.roles, rule.maturity) == (["coder"], "candidate")
    assert set(rule.evidence_agent_run_ids) == {coder.pk}  # the second is a duplicate delta
    assert PlaybookDelta.objects.filter(text=LESSON, status="rejected").count() == 1


def test_a_failed_review_is_a_finding_for_the_agents_whose_work_it_failed(burst: Burst) -> None:
    coder, tester = failed_review(burst)
    assert coder.quantum_run is not None
    crashed = agent(coder.quantum_run, "reviewer", 2, status="error", error="Out of memory")
    found, _ = extraction.findings(burst.pk)
    failures = [f for f in found if f.kind in ("failed_review", "failure")]
    assert [(f.kind, f.role, f.by, f.agent_run_ids) for f in failures] == [
        ("failed_review", "coder", "tester", [coder.pk, tester.pk]),
        ("failure", "reviewer", "", [crashed.pk]),
    ]
    assert extraction.proposal_text(failures[0]) == (
        f"Avoid: {VERDICT} (failed by the tester)",
        "anti_pattern",
    )


# --- the Tether's rejections ----------------------------------------------------------------


def test_rejected_changes_and_drifts_become_findings_once(burst: Burst) -> None:
    coder, tester = failed_review(burst)
    assert coder.quantum_run is not None
    now = timezone.now()
    ChangeReview.objects.create(
        quantum_run=coder.quantum_run,
        quantum=coder.quantum,
        branch="q/1",
        base="main",
        head_sha="a" * 40,
        status=ChangeStatus.REJECTED,
        comment="Renamed a public function without a deprecation\nmore detail",
        decided_at=now - timedelta(seconds=5),
    )
    Drift.objects.create(
        agent_run=tester,
        quantum=tester.quantum,
        assumption="dates are stored as local time",
        status=DriftStatus.REJECTED,
        comment="we store UTC",
        decided_at=now - timedelta(seconds=4),
    )
    run = ReflectionRun.objects.create(burst=burst, wave_id=burst.wave_id)
    found = extraction.rejections(*extraction.window(run))
    assert [(f.kind, f.role, f.agent_run_ids) for f in found] == [
        ("rejected_change", "coder", [coder.pk]),  # the agent that committed it
        ("rejected_drift", "tester", [tester.pk]),
    ]
    texts = [extraction.proposal_text(f) for f in found]
    assert texts == [
        (
            "Avoid: Renamed a public function without a deprecation (a change the Tether rejected)",
            "anti_pattern",
        ),
        (
            "Avoid: assuming dates are stored as local time (the Tether rejected it: we store UTC)",
            "anti_pattern",
        ),
    ]
    later_burst = Burst.objects.create(wave_id=burst.wave_id, number=2)
    later = ReflectionRun.objects.create(burst=later_burst, wave_id=burst.wave_id)
    assert extraction.rejections(*extraction.window(later)) == []  # read by the one before


# --- the scripted provider's choices --------------------------------------------------------


def request(system: str, task: str, last_result: str = "") -> ProviderRequest:
    messages: list[Any] = [{"role": "user", "content": task}]
    if last_result:
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": "looking"}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": last_result,
                        "is_error": False,
                    }
                ],
            },
        ]
    info = RunInfo(
        agent_run_id=1,
        agent_id="1_s1_coder",
        role="coder",
        attempt=1,
        quantum_id=1,
        labels=("choosy",),
    )
    return ProviderRequest("scripted", system, messages, [], 100, info)


def test_a_choose_turn_plays_the_first_alternative_that_holds(
    tmp_path: Path, settings: Any
) -> None:
    scripts(
        tmp_path,
        settings,
        """name: reflector-test
match: {roles: [coder], labels: [choosy]}
turns:
  - choose:
      - when: {prompt: "RUN THE TESTS first"}
        text: "testing q{quantum_id}"
      - text: "skipping"
  - choose:
      - when: {result: "found"}
        text: "found it"
      - when: {result: "missing"}
        text: "it is missing"
""",
    )
    provider = ScriptedProvider()
    said = provider.complete(request("sys", "## Playbook\n- Run the tests first"), lambda _: None)
    assert said.text == "testing q1"
    assert provider.complete(request("sys", "no rules"), lambda _: None).text == "skipping"
    assert provider.complete(request("", "x", "it was found"), lambda _: None).text == "found it"
    assert provider.complete(request("", "x", "missing"), lambda _: None).text == "it is missing"
    nothing = provider.complete(request("", "x", "other"), lambda _: None)
    assert "no alternative of turn 2 holds" in nothing.text and not nothing.tool_uses


@pytest.mark.parametrize(
    ("turns", "problem"),
    [
        ("  - when: {prompt: x}\n    text: t\n", "unknown key 'when'"),
        ("  - choose: []\n", "a non-empty list of alternative turns"),
        ("  - choose: [{text: a}]\n    text: b\n", "holds only `choose`"),
        ("  - choose: [{when: {prompt: x, mood: y}, text: a}]\n", "unknown key 'mood'"),
        ("  - choose: [{when: {prompt: ''}, text: a}]\n", "a non-empty text"),
        ("  - choose: [{choose: [{text: a}]}]\n", "unknown key 'choose'"),
    ],
)
def test_a_malformed_choose_names_its_line(tmp_path: Path, turns: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nturns:\n" + turns)
    with pytest.raises(InvalidDefinition, match=r"bad\.yaml:") as raised:
        script_parse(path)
    assert problem in str(raised.value)
