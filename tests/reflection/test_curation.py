"""The evidence gate: each proposal's support counted as session search counts it, all the
proposals in one statement, and the unsupported ones rejected with what was searched."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.db import connection

from bursts.models import Burst
from core.events import publish
from core.models import Session
from core.search import event_search_flush, sessions_count, sessions_search
from reflection import curation
from reflection.errors import IllegalTransition
from reflection.models import PlaybookDelta, PlaybookRule
from reflection.services.playbook import delta_decide, delta_propose, deltas_reject, rule_create
from reflection.services.runs import reflection_run_start
from reflection.text import key_terms

pytestmark = pytest.mark.django_db

SUPPORTED = "Run the migrations check before committing a model change"
ONCE = "Reset the websocket fixtures after each reconnection test"
NOWHERE = "Quote the tsquery terms before building the search"


def session_with(n: int, *texts: str) -> Session:
    session = Session.objects.create(kind="agent_run", ref=str(1000 + n), title=f"{n}_s0_coder")
    for text in texts:
        publish(f"agent:{n}_s0_coder", "text", {"text": text}, session_id=session.pk)
    return session


@pytest.fixture
def sessions() -> list[Session]:
    """Two sessions note the migrations check (one of them twice), a third commits without
    it, one notes the websocket fixtures; the last holds only noise."""
    return [
        session_with(1, f"note: {SUPPORTED}", f"again: {SUPPORTED.lower()}"),
        session_with(2, "ran the migrations check before committing", "model change ok"),
        session_with(3, "checked the model change before committing"),
        session_with(4, f"learned: {ONCE}", "tool output: 3 passed"),
        session_with(5, "tool output: 3 passed", "All checks passed!"),
    ]


def test_it_counts_each_proposal_as_session_search_finds_it(sessions: list[Session]) -> None:
    texts = [SUPPORTED, ONCE, NOWHERE, "a an the", SUPPORTED.upper() + "!"]
    expected = [
        len({h.session_id for h in sessions_search(" ".join(key_terms(t)))}) if key_terms(t) else 0
        for t in texts
    ]
    assert expected == [2, 1, 0, 0, 2]  # session 3 never names the migrations
    assert curation.evidence_sessions(texts) == expected


def test_it_counts_every_proposal_in_one_statement(
    sessions: list[Session], django_assert_max_num_queries: Any
) -> None:
    texts = [SUPPORTED, ONCE, NOWHERE] * 20
    # The index flush in its savepoint, then one statement for all sixty.
    with django_assert_max_num_queries(4):
        counts = curation.evidence_sessions(texts)
    assert counts == [2, 1, 0] * 20


def test_it_counts_as_a_database_user_that_may_not_flush_the_search_index(
    sessions: list[Session],
) -> None:
    role = f"annihilation_reader_{os.getpid()}"  # created and dropped with the test's transaction
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role}")
        cursor.execute(f"GRANT SELECT ON core_event TO {role}")
        cursor.execute(f"SET LOCAL ROLE {role}")
    try:
        assert event_search_flush() is False  # only the index's owner may
        assert curation.evidence_sessions([SUPPORTED, ONCE, NOWHERE]) == [2, 1, 0]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert event_search_flush() is True


def test_it_counts_sessions_up_to_the_limit(sessions: list[Session]) -> None:
    assert sessions_count(["passed", "migrations check"], limit=1) == [1, 1]
    assert sessions_count(["passed", "migrations check"]) == [2, 2]
    assert sessions_count([]) == []


def test_the_gate_rejects_the_proposals_too_few_sessions_support(
    burst: Burst, sessions: list[Session], settings: Any
) -> None:
    settings.REFLECTION_EVIDENCE_MIN_SESSIONS = 2
    run, _ = reflection_run_start(burst.pk)
    deltas = {
        text: delta_propose(op="add", text=text, reflection_run_id=run.pk)
        for text in (SUPPORTED, ONCE, NOWHERE)
    }
    assert curation.gate(run) == 2
    decided = {t: PlaybookDelta.objects.get(pk=d.pk) for t, d in deltas.items()}
    assert decided[SUPPORTED].status == "proposed"
    assert decided[ONCE].status == "rejected"
    assert decided[ONCE].reason == (
        "evidence gate: 1 matching session(s), 2 needed (searched: reconnection websocket fixtures)"
    )
    assert decided[NOWHERE].reason.startswith("evidence gate: 0 matching session(s), 2 needed")
    assert curation.gate(run) == 0  # the rejected ones are decided: not gated again


def test_curation_proposes_a_failing_rules_anti_pattern_with_its_scope_and_evidence(
    burst: Burst,
) -> None:
    failing = rule_create(
        text="Commit straight to main",
        roles=["coder"],
        labels=["git"],
        paths=["deploy/"],
        evidence_event_ids=[7],
        evidence_agent_run_ids=[3],
    )
    PlaybookRule.objects.filter(pk=failing.pk).update(harmful=3, helpful=1)
    run, _ = reflection_run_start(burst.pk)
    assert curation.curate(run)["inverted"] == 1
    delta = PlaybookDelta.objects.get(reflection_run=run)
    inverted = PlaybookRule.objects.get(kind="anti_pattern")  # the accepted delta's rule
    assert (delta.op, delta.kind, delta.status, delta.rule_id) == (
        "add",
        "anti_pattern",
        "accepted",
        inverted.pk,
    )
    assert (inverted.text, inverted.roles, inverted.evidence_event_ids) == (
        "Avoid: Commit straight to main",
        ["coder"],
        [7],
    )
    assert delta.text == "Avoid: Commit straight to main"
    assert (delta.scope, delta.roles, delta.labels, delta.paths) == (
        "project",
        ["coder"],
        ["git"],
        ["deploy/"],
    )
    assert (delta.evidence_event_ids, delta.evidence_agent_run_ids) == ([7], [3])
    assert delta.reason == "inverted: 3 failures, 1 successes"
    failing.refresh_from_db()
    assert failing.maturity == "deprecated"


def test_rejecting_at_once_rejects_none_when_one_was_decided_already(burst: Burst) -> None:
    run, _ = reflection_run_start(burst.pk)
    first, second = (
        delta_propose(op="add", text=text, reason="from a learning", reflection_run_id=run.pk)
        for text in (SUPPORTED, ONCE)
    )
    delta_decide(second.pk, to="rejected", by="operator", reason="not ours")
    with pytest.raises(IllegalTransition):
        deltas_reject({first.pk: "duplicate", second.pk: "duplicate"}, by=curation.CURATOR)
    assert PlaybookDelta.objects.get(pk=first.pk).status == "proposed"
    assert PlaybookDelta.objects.get(pk=second.pk).reason == "not ours"

    assert deltas_reject({first.pk: ""}, by=curation.CURATOR) == 1  # empty: its own reason
    rejected = PlaybookDelta.objects.get(pk=first.pk)
    assert (rejected.status, rejected.reason, rejected.decided_by) == (
        "rejected",
        "from a learning",
        "reflection",
    )
    assert rejected.decided_at is not None
