"""The hub's rules as tables: a snapshot in, the state and (part of) the reason out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from autopilot.predicates import (
    budget_allows,
    day_budget_spent,
    decide,
    has_work,
    may_contemplate,
    may_improve,
    needs_healing,
    needs_wave,
)
from autopilot.snapshot import (
    READY_CAP,
    FailingEndpoint,
    RepositoryState,
    Snapshot,
    StuckAgent,
    TickSettings,
)
from autopilot.spend import Limits

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LIMITS = TickSettings(
    scan_every_s=3600,
    contemplate_every_s=86400,
    proposals_max=5,
    base_failures=2,
    base_check_every_s=600,
    stuck_s=900,
    budgets=Limits(
        cap=None,
        day=Decimal("20.00"),
        states={
            "executing": Decimal("15.00"),
            "improving": Decimal("3.00"),
            "contemplating": Decimal("1.00"),
            "healing": Decimal("2.00"),
        },
    ),
)
FULL = {
    "executing": Decimal("15"),
    "improving": Decimal("3"),
    "contemplating": Decimal("1"),
    "healing": Decimal("2"),
}
SPENT = {state: Decimal(0) for state in FULL}
RECENT = NOW - timedelta(minutes=10)
STUCK = (StuckAgent(7, "12_s0_coder", 3, None, 1200.0),)
ENDPOINT = (FailingEndpoint("anthropic", "claude-x", 4),)


def snap(**fields: Any) -> Snapshot:
    """An idle, unpaused hub with full budgets, scanned and contemplated recently, over one
    repository (`default`) whose base check and proposals are the `base_*` and `proposals`
    fields; `repositories` replaces it."""
    left = {**FULL, **fields.pop("left", {})}
    default = RepositoryState(
        repository_id=1,
        name="default",
        base_failures=fields.pop("base_failures", 0),
        base_sha=fields.pop("base_sha", ""),
        base_healing_id=fields.pop("base_healing_id", None),
        proposals=fields.pop("proposals", 0),
    )
    fields.setdefault("repositories", (default,))
    base: dict[str, Any] = {
        "at": NOW,
        "limits": LIMITS,
        "paused": False,
        "scanned_at": RECENT,
        "contemplated_at": RECENT,
        "budget_left": left,
        "spent_today": {**SPENT, **fields.pop("spent", {})},
    }
    base.update(fields)
    return Snapshot(**base)


TABLE: list[tuple[str, Snapshot, str, str]] = [
    # (case, snapshot, state, a piece of the reason)
    ("idle, all done recently", snap(), "resting", "nothing to do"),
    ("idle says when the next scan is", snap(), "resting", "the last scan was 10 min ago"),
    ("ready quanta", snap(ready=3), "executing", "3 autopilot quanta ready"),
    ("one ready quantum", snap(ready=1), "executing", "1 autopilot quantum ready"),
    (
        "ready at the cap",
        snap(ready=READY_CAP),
        "executing",
        f"{READY_CAP} or more autopilot quanta",
    ),
    ("approved goals", snap(goals_approved=2), "executing", "2 approved goals awaiting"),
    ("a planner runs", snap(goals_decomposing=1), "executing", "1 goal being decomposed"),
    ("quanta in progress", snap(in_progress=4, wave_id=9), "executing", "wave 9 running"),
    ("executing shows its budget", snap(ready=1), "executing", "$15.00 of the executing"),
    (
        "work but no executing budget",
        snap(ready=3, left={"executing": Decimal(0)}),
        "resting",
        "work waits for budget",
    ),
    ("idle and a scan due", snap(scanned_at=None), "improving", "no scan yet"),
    (
        "idle and the scan old",
        snap(scanned_at=NOW - timedelta(hours=2)),
        "improving",
        "the last scan was 2 h ago (one every 1 h)",
    ),
    (
        "scan due but no improving budget",
        snap(scanned_at=None, left={"improving": Decimal(0)}),
        "resting",
        "no scan: $0.00 of the improving budget's $3.00 left today",
    ),
    (
        "work beats a due scan",
        snap(scanned_at=None, ready=2),
        "executing",
        "2 autopilot quanta ready",
    ),
    (
        "idle and a contemplation due",
        snap(contemplated_at=NOW - timedelta(days=2)),
        "contemplating",
        "0 proposals waiting (at most 5 per repository)",
    ),
    (
        "a scan due beats a contemplation due",
        snap(scanned_at=None, contemplated_at=None),
        "improving",
        "scan",
    ),
    (
        "too many proposals wait",
        snap(contemplated_at=None, proposals=5),
        "resting",
        "5 proposals wait for approval (at most 5 per repository)",
    ),
    (
        "contemplation due, no contemplating budget",
        snap(contemplated_at=None, left={"contemplating": Decimal(0)}),
        "resting",
        "no contemplation: $0.00 of the contemplating budget's $1.00",
    ),
    ("a stuck agent", snap(stuck=STUCK), "healing", "1 agent stuck with no progress for 20 min"),
    ("a stuck agent names it", snap(stuck=STUCK), "healing", "12_s0_coder (run 7)"),
    (
        "healing beats work",
        snap(stuck=STUCK, ready=5, goals_approved=1),
        "healing",
        "healing:",
    ),
    (
        "a failing endpoint",
        snap(endpoints=ENDPOINT),
        "healing",
        "endpoint anthropic/claude-x failing (4 failures in a row)",
    ),
    (
        "the base branch failing",
        snap(base_failures=2, base_sha="abcdef1234567"),
        "healing",
        "the integration branch of default failed its checks 2 times in a row (at abcdef1234",
    ),
    (
        "one repository's branch failing, another's healing quantum open",
        snap(
            repositories=(
                RepositoryState(1, "default", base_failures=3, base_healing_id=44),
                RepositoryState(2, "second", base_failures=2, base_sha="0123456789ab"),
            )
        ),
        "healing",
        "the integration branch of second failed its checks 2 times in a row (at 0123456789",
    ),
    (
        "the base branch failed once only",
        snap(base_failures=1, base_sha="abcdef1234567"),
        "resting",
        "nothing to do",
    ),
    (
        "the base branch failing, its healing quantum open",
        snap(base_failures=3, base_healing_id=44, ready=1),
        "executing",
        "1 autopilot quantum ready",
    ),
    (
        "healing without budget waits, work goes on",
        snap(stuck=STUCK, ready=1, left={"healing": Decimal(0)}),
        "executing",
        "ready",
    ),
    (
        "healing without budget and nothing else",
        snap(base_failures=2, left={"healing": Decimal(0)}),
        "resting",
        "healing waits for budget",
    ),
    (
        "the day's budget spent",
        snap(
            ready=4,
            scanned_at=None,
            left=dict.fromkeys(FULL, Decimal(0)),
            spent={"executing": Decimal("15"), "improving": Decimal("5")},
        ),
        "resting",
        "the day's budget is spent ($20.00 spent today of $20.00)",
    ),
    (
        "no limits at all",
        snap(ready=1, left=dict.fromkeys(FULL, None)),
        "executing",
        "no limit on the executing budget",
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "state", "reason"),
    [(s, state, reason) for _, s, state, reason in TABLE],
    ids=[case for case, *_ in TABLE],
)
def test_it_decides(snapshot: Snapshot, state: str, reason: str) -> None:
    decision = decide(snapshot)
    assert decision.state == state, decision.reason
    assert reason in decision.reason


PREDICATES: list[tuple[str, Any, Snapshot, bool]] = [
    ("has_work: idle", has_work, snap(), False),
    ("has_work: ready", has_work, snap(ready=1), True),
    ("has_work: in progress", has_work, snap(in_progress=1), True),
    ("has_work: proposals are not work", has_work, snap(goals_proposed=3), False),
    ("has_work: active goals alone are not work", has_work, snap(goals_active=3), False),
    ("needs_wave: ready, none runs", needs_wave, snap(ready=2), True),
    ("needs_wave: ready, one runs", needs_wave, snap(ready=2, wave_id=4), False),
    ("needs_wave: nothing ready", needs_wave, snap(in_progress=2), False),
    ("needs_healing: nothing", needs_healing, snap(), False),
    ("needs_healing: stuck", needs_healing, snap(stuck=STUCK), True),
    ("needs_healing: base at the limit", needs_healing, snap(base_failures=2), True),
    ("needs_healing: base, quantum open", needs_healing, snap(base_failures=9, base_healing_id=1), False),
    ("may_improve: busy", may_improve, snap(scanned_at=None, ready=1), False),
    ("may_improve: just scanned", may_improve, snap(scanned_at=NOW), False),
    ("may_improve: due", may_improve, snap(scanned_at=NOW - timedelta(seconds=3600)), True),
    ("may_contemplate: 4 of 5 proposals", may_contemplate, snap(contemplated_at=None, proposals=4), True),
    ("may_contemplate: one repository full, another has room", may_contemplate, snap(contemplated_at=None, repositories=(RepositoryState(1, "default", proposals=5), RepositoryState(2, "second", proposals=1))), True),
    ("may_contemplate: every repository full", may_contemplate, snap(contemplated_at=None, repositories=(RepositoryState(1, "default", proposals=5), RepositoryState(2, "second", proposals=7))), False),
    ("may_contemplate: no budget", may_contemplate, snap(contemplated_at=None, left={"contemplating": Decimal("0")}), False),
    ("day_budget_spent: one state left", day_budget_spent, snap(left={**dict.fromkeys(FULL, Decimal(0)), "healing": Decimal("0.5")}), False),
    ("day_budget_spent: none left", day_budget_spent, snap(left=dict.fromkeys(FULL, Decimal(0))), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("predicate", "snapshot", "expected"),
    [(p, s, e) for _, p, s, e in PREDICATES],
    ids=[case for case, *_ in PREDICATES],
)
def test_it_evaluates_each_predicate(predicate: Any, snapshot: Snapshot, expected: bool) -> None:
    assert predicate(snapshot) is expected


def test_it_treats_a_missing_budget_as_unlimited() -> None:
    assert budget_allows(snap(left={"executing": None}), "executing")
    assert not budget_allows(snap(left={"executing": Decimal("0")}), "executing")


def test_it_records_the_snapshot_as_json() -> None:
    data = snap(stuck=STUCK, ready=2).as_data()
    assert data["ready"] == 2
    assert data["stuck"][0]["agent_id"] == "12_s0_coder"
    assert data["budget_left"]["executing"] == "15"
    assert data["at"].startswith("2026-11-24")
