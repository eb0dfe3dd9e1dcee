"""What the hub decides on: one snapshot of the system, as plain values.

`snapshot_take` reads everything the predicates need in a few statements: one SQL statement for
the hub row, the ready autopilot quanta, the autopilot's wave, goals by status, each
repository's integration branch's latest checks and waiting proposals, and stuck agents; the budgets and holds (autopilot.spend, one statement)
and the failing endpoints (psychonauts.routing.endpoints) through their own selectors. The predicates
(autopilot.predicates) are pure functions of it, so they are tested as tables of snapshots.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from autopilot import spend
from autopilot.labels import AUTOPILOT
from autopilot.models import BaseCheck, Goal, GoalStatus, Hub, HubState
from autopilot.spend import budget_status
from bursts.models import AGENT_LIVE, AgentRun, Wave
from core.models import Event
from core.sql import sql_names
from psychonauts.models import AgentTurn
from psychonauts.routing.endpoints import endpoints_failing
from quanta.models import Quantum
from repos.context import DEFAULT_NAME
from repos.models import Repository

# Counting the ready (and the in-progress) autopilot quanta stops here: the hub needs "is there
# work, and roughly how much", not an exact count of a large backlog: an uncapped count fetches
# every match from the heap.
READY_CAP = 100

# The states whose work spends (resting spends nothing).
WORK_STATES: tuple[str, ...] = (
    HubState.EXECUTING.value,
    HubState.IMPROVING.value,
    HubState.CONTEMPLATING.value,
    HubState.HEALING.value,
)


@dataclass(frozen=True)
class StuckAgent:
    """A running agent with no sign of progress for `quiet_s` seconds."""

    agent_run_id: int
    agent_id: str
    quantum_run_id: int | None
    parent_id: int | None
    quiet_s: float


@dataclass(frozen=True)
class FailingEndpoint:
    provider: str
    model: str
    failures: int  # in a row


@dataclass(frozen=True)
class RepositoryState:
    """What the hub reads of one registered repository: its integration branch's checks (healing
    and the base checks are per repository) and the contemplation proposals waiting in it."""

    repository_id: int | None  # None: the default repository, which has no row yet
    name: str
    has_checks: bool = True  # verify commands (or the scanners' test command) are configured
    base_failures: int = 0  # failed checks in a row, latest first
    base_sha: str = ""  # the latest check's commit
    base_checked_at: datetime | None = None
    base_healing_id: int | None = None  # the healing quantum filed for them, while open
    proposals: int = 0  # goals contemplation proposed in it that wait for the operator


@dataclass(frozen=True)
class TickSettings:
    """The settings the predicates compare against, taken with the snapshot: the schedule's,
    healing's, and the budgets (as the spending gate reads them)."""

    scan_every_s: float
    contemplate_every_s: float
    proposals_max: int
    base_failures: int
    base_check_every_s: float
    stuck_s: float
    budgets: spend.Limits

    @classmethod
    def from_settings(cls) -> TickSettings:
        return cls(
            scan_every_s=float(settings.AUTOPILOT_SCAN_EVERY_S),
            contemplate_every_s=float(settings.AUTOPILOT_CONTEMPLATE_EVERY_S),
            proposals_max=int(settings.AUTOPILOT_PROPOSALS_MAX),
            base_failures=int(settings.AUTOPILOT_BASE_FAILURES),
            base_check_every_s=float(settings.AUTOPILOT_BASE_CHECK_S),
            stuck_s=float(settings.AUTOPILOT_STUCK_S),
            budgets=spend.Limits.now(),
        )


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    limits: TickSettings
    # The hub row.
    state: str = HubState.RESTING
    reason: str = ""
    paused: bool = True
    paused_reason: str = ""
    forced: bool = False
    scanned_at: datetime | None = None
    contemplated_at: datetime | None = None
    # Work: ready autopilot quanta (capped at READY_CAP), those in progress (capped), the
    # running wave that covers them, goals by status.
    ready: int = 0
    in_progress: int = 0
    wave_id: int | None = None
    goals_proposed: int = 0
    goals_approved: int = 0
    goals_decomposing: int = 0
    goals_active: int = 0
    goals_verifying: int = 0
    # Budgets: today's left per hub state (None = unlimited), spent per scope, the global cap.
    budget_left: dict[str, Decimal | None] = field(default_factory=dict)
    spent_today: dict[str, Decimal] = field(default_factory=dict)
    cap_usd: Decimal | None = None
    cap_spent_usd: Decimal = Decimal(0)
    cap_reached: bool = False
    holds: int = 0  # runs held by a budget
    # Healing.
    stuck: tuple[StuckAgent, ...] = ()
    endpoints: tuple[FailingEndpoint, ...] = ()
    repositories: tuple[RepositoryState, ...] = ()

    def as_data(self) -> dict[str, Any]:
        """As JSON (the transition's record of why)."""
        data: dict[str, Any] = json.loads(json.dumps(asdict(self), default=str))
        return data


_H = sql_names(Hub, "h_")
_Q = sql_names(Quantum, "q_")
_W = sql_names(Wave, "w_")
_G = sql_names(Goal, "g_")
_B = sql_names(BaseCheck, "b_")
_R = sql_names(Repository, "r_")
_A = sql_names(AgentRun, "a_")
_T = sql_names(AgentTurn, "t_")
_E = sql_names(Event, "e_")

# One round trip for everything the hub reads of its own tables and the others'. The capped
# counts stop at the cap, through whichever of quantum_ready_order, quantum_status_priority and
# the labels GIN index the planner finds cheaper for the share of autopilot quanta; waves use
# the partial index wave_status; goals goal_status_order (a seq scan while the table is small);
# the checks basecheck_time; agents the partial index agentrun_live, their last turn
# agentturn_unique and their last event event_topic_seq (bench/autopilot_tick.py measures it).
#
# An agent's progress is the latest of its start, its last turn (written when the model answers)
# and its last event (a turn opening, a tool starting, streamed text, a resume after a wait on
# the Tether: the heartbeat alone says nothing, the lease renews it while a call hangs). An agent
# with a live sub-agent is waiting on it: the sub-agent is the one judged.
_SNAPSHOT = """
SELECT h.{h_state}, h.{h_reason}, h.{h_paused}, h.{h_paused_reason}, h.{h_forced},
       h.{h_scanned_at}, h.{h_contemplated_at},
  (SELECT count(*) FROM (
      SELECT 1 FROM {q_table} q
      WHERE q.{q_status} = 'open' AND q.{q_open_blockers} = 0
        AND q.{q_labels} && ARRAY[%(label)s]::varchar(64)[]
      LIMIT %(cap)s) r) AS ready,
  (SELECT count(*) FROM (
      SELECT 1 FROM {q_table} q
      WHERE q.{q_status} = 'in_progress' AND q.{q_labels} && ARRAY[%(label)s]::varchar(64)[]
      LIMIT %(cap)s) r) AS in_progress,
  (SELECT w.{w_id} FROM {w_table} w
    WHERE w.{w_status} = 'running'
      AND (w.{w_labels} = '{{}}' OR w.{w_labels} @> ARRAY[%(label)s]::varchar(64)[])
    ORDER BY w.{w_id} LIMIT 1) AS wave,
  (SELECT json_object_agg(s, n) FROM (
      SELECT g.{g_status} AS s, count(*) AS n FROM {g_table} g
      WHERE g.{g_status} = ANY(%(goal_statuses)s) GROUP BY g.{g_status}) c) AS goals,
  (SELECT json_agg(json_build_array(r.{r_id}, r.{r_name}, r.{r_is_default},
                                    cardinality(r.{r_verify_commands}), c.checks, hq.healing,
                                    gp.n) ORDER BY r.{r_id})
   FROM {r_table} r
   LEFT JOIN LATERAL (
      SELECT json_agg(json_build_array(b.{b_ok}, b.{b_sha}, b.{b_created_at})) AS checks FROM (
          SELECT {b_ok}, {b_sha}, {b_created_at} FROM {b_table}
          WHERE {b_repository_id} = r.{r_id}
          ORDER BY {b_created_at} DESC, {b_id} DESC LIMIT %(base_n)s) b) c ON true
   LEFT JOIN LATERAL (
      SELECT b.{b_quantum_id} AS healing FROM {b_table} b
      JOIN {q_table} q ON q.{q_id} = b.{b_quantum_id}
      WHERE b.{b_repository_id} = r.{r_id} AND q.{q_status} <> 'closed'
      ORDER BY b.{b_created_at} DESC LIMIT 1) hq ON true
   LEFT JOIN LATERAL (
      SELECT count(*) AS n FROM {g_table} g
      WHERE g.{g_repository_id} = r.{r_id} AND g.{g_status} = 'proposed'
        AND g.{g_source} = 'contemplation') gp ON true
   WHERE r.{r_removed_at} IS NULL) AS repositories,
  (SELECT json_agg(json_build_array(p.id, p.agent_id, p.quantum_run_id, p.parent_id,
                                    EXTRACT(EPOCH FROM %(now)s - p.progress_at)))
   FROM (
      SELECT a.{a_id} AS id, a.{a_agent_id} AS agent_id, a.{a_quantum_run_id} AS quantum_run_id,
             a.{a_parent_id} AS parent_id,
             GREATEST(a.{a_started_at}, t.last, e.last) AS progress_at
      FROM {a_table} a
      LEFT JOIN LATERAL (
          SELECT t.{t_created_at} AS last FROM {t_table} t
          WHERE t.{t_agent_run_id} = a.{a_id} ORDER BY t.{t_index} DESC LIMIT 1) t ON true
      LEFT JOIN LATERAL (
          SELECT e.{e_created_at} AS last FROM {e_table} e
          WHERE e.{e_topic} = 'agent:' || a.{a_agent_id} ORDER BY e.{e_id} DESC LIMIT 1) e ON true
      WHERE a.{a_status} = 'running' AND a.{a_started_at} < %(stuck_before)s
        AND NOT EXISTS (SELECT 1 FROM {a_table} c
                        WHERE c.{a_parent_id} = a.{a_id} AND c.{a_status} = ANY(%(live)s))
   ) p
   WHERE p.progress_at < %(stuck_before)s) AS stuck
""".format(**_H, **_Q, **_W, **_G, **_B, **_R, **_A, **_T, **_E)
# Read alone: the hub's row if there is one.
_READ = _SNAPSHOT + "FROM (SELECT 1) one LEFT JOIN {h_table} h ON h.{h_id} = 1".format(**_H)


@functools.cache
def _with(hub_cte: str) -> str:
    return f"WITH {hub_cte}\n{_SNAPSHOT}FROM h"


_GOAL_STATUSES = [
    GoalStatus.PROPOSED,
    GoalStatus.APPROVED,
    GoalStatus.DECOMPOSING,
    GoalStatus.ACTIVE,
    GoalStatus.VERIFYING,
]


def _aware(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _has_checks(*, is_default: bool, commands: int) -> bool:
    """Whether a repository has checks to run: its verify commands (the default repository's
    include TETHER_VERIFY_COMMANDS) or the scanners' test command (every repository's)."""
    if commands or str(getattr(settings, "AUTOPILOT_SCAN_TEST_COMMAND", "") or "").strip():
        return True
    return is_default and bool(settings.TETHER_VERIFY_COMMANDS)


def _repositories(rows: list[list[Any]]) -> tuple[RepositoryState, ...]:
    states: list[RepositoryState] = []
    for repository_id, name, is_default, commands, checks, healing, proposals in rows:
        checks = checks or []
        streak = 0
        for ok, _sha, _at in checks:
            if ok:
                break
            streak += 1
        states.append(
            RepositoryState(
                repository_id=int(repository_id),
                name=str(name),
                has_checks=_has_checks(is_default=bool(is_default), commands=int(commands or 0)),
                base_failures=streak,
                base_sha=str(checks[0][1]) if checks else "",
                base_checked_at=_aware(checks[0][2]) if checks else None,
                base_healing_id=healing,
                proposals=int(proposals or 0),
            )
        )
    if not any(is_default for _, _, is_default, *_ in rows):
        # A fresh installation's default repository (ANNIHILATION_REPO) before its row is made:
        # its checks are due all the same (the check makes the row).
        states.insert(
            0,
            RepositoryState(
                repository_id=None,
                name=DEFAULT_NAME,
                has_checks=_has_checks(is_default=True, commands=0),
            ),
        )
    return tuple(states)


def snapshot_take(*, now: datetime | None = None) -> Snapshot:
    """The system as the hub sees it now."""
    snapshot = _take(_READ, now=now or timezone.now(), params={})
    assert snapshot is not None  # one row, with or without the hub's
    return snapshot


def snapshot_with(
    *, hub_cte: str, params: Mapping[str, Any], now: datetime | None = None
) -> Snapshot | None:
    """The snapshot read by the statement that also runs `hub_cte`: a CTE named `h` that
    yields the hub's row (the tick's locks and stamps it: one round trip); None when `h`
    yields no row. `params` are the CTE's named parameters."""
    return _take(_with(hub_cte), now=now or timezone.now(), params=params)


def _take(sql: str, *, now: datetime, params: Mapping[str, Any]) -> Snapshot | None:
    limits = TickSettings.from_settings()
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                **params,
                "label": AUTOPILOT,
                "cap": READY_CAP,
                "goal_statuses": _GOAL_STATUSES,
                "base_n": max(limits.base_failures, 10),
                "now": now,
                "stuck_before": now - timedelta(seconds=limits.stuck_s),
                "live": sorted(AGENT_LIVE),
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    (state, reason, paused, paused_reason, forced, scanned_at, contemplated_at) = row[:7]
    ready, in_progress, wave_id, goals, repository_rows, stuck_rows = row[7:]
    goals = goals or {}
    budgets = budget_status()
    cap = budgets.cap
    # One marked down already waits out its time: nothing more to do for it.
    failing = tuple(
        FailingEndpoint(e.provider, e.model, e.failures)
        for e in endpoints_failing()
        if e.down_until is None
    )
    return Snapshot(
        at=now,
        limits=limits,
        state=state if state is not None else HubState.RESTING,
        reason=reason or "",
        paused=True if paused is None else bool(paused),
        paused_reason=paused_reason or "",
        forced=bool(forced),
        scanned_at=scanned_at,
        contemplated_at=contemplated_at,
        ready=int(ready),
        in_progress=int(in_progress),
        wave_id=wave_id,
        goals_proposed=int(goals.get(GoalStatus.PROPOSED, 0)),
        goals_approved=int(goals.get(GoalStatus.APPROVED, 0)),
        goals_decomposing=int(goals.get(GoalStatus.DECOMPOSING, 0)),
        goals_active=int(goals.get(GoalStatus.ACTIVE, 0)),
        goals_verifying=int(goals.get(GoalStatus.VERIFYING, 0)),
        budget_left={state: budgets.left.get(state) for state in WORK_STATES},
        spent_today={str(scope): usd for scope, usd in budgets.spent.items()},
        cap_usd=cap.cap_usd,
        cap_spent_usd=cap.spent_usd,
        cap_reached=cap.reached,
        holds=budgets.holds,
        stuck=tuple(
            StuckAgent(int(i), str(aid), run, parent, float(quiet))
            for i, aid, run, parent, quiet in (stuck_rows or [])
        ),
        endpoints=failing,
        repositories=_repositories(repository_rows or []),
    )


__all__ = [
    "READY_CAP",
    "WORK_STATES",
    "FailingEndpoint",
    "RepositoryState",
    "Snapshot",
    "StuckAgent",
    "TickSettings",
    "snapshot_take",
    "snapshot_with",
]
