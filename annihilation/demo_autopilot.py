"""The demo's autopilot pass: a goal approved, decomposed, executed, verified and merged; then
the hub improves the repository on its own and comes to rest.

The pass ticks the hub itself (every TICK_S, as beat would, only faster) and prints each state
change with its reason, and each step of the goal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.management.base import OutputWrapper
from django.utils import timezone

from autopilot.labels import AUTOPILOT
from autopilot.models import Finding, Goal, GoalStatus, GoalTransition, HubState, HubTransition
from autopilot.selectors import hub_get
from autopilot.services.goals.lifecycle import goal_abandon, goal_approve, goal_create
from autopilot.services.hub import hub_pause, hub_resume, hub_tick
from core.cli import shorten
from quanta.models import Quantum
from tether.errors import TetherError
from tether.models import ChangeReview, ChangeStatus, Risk
from tether.services import change_approve

GOAL_LABEL = "demo-goal"
TICK_S = 0.5
DEMO_BY = "demo"
# The pass's settings, for the worker it starts (environment) and for its own ticks: the
# autopilot's low-risk changes merge on their own, the scanners may run again a minute after
# the last pass (so that each demo shows one), and contemplation stays out of the demo.
AUTOPILOT_ENV = {
    "ANNIHILATION_AUTOPILOT_AUTO_MERGE_LOW_RISK": "true",
    "ANNIHILATION_AUTOPILOT_SCAN_EVERY_S": "60",
    "ANNIHILATION_AUTOPILOT_PROPOSALS_MAX": "0",
}
_SETTINGS: dict[str, Any] = {
    "AUTOPILOT_AUTO_MERGE_LOW_RISK": True,
    "AUTOPILOT_SCAN_EVERY_S": 60.0,
    "AUTOPILOT_PROPOSALS_MAX": 0,
}


@contextmanager
def demo_settings() -> Iterator[None]:
    """This process's settings as AUTOPILOT_ENV gives them to the worker, for the pass."""
    saved = {name: getattr(settings, name) for name in _SETTINGS}
    for name, value in _SETTINGS.items():
        setattr(settings, name, value)
    # The pass prints the history itself; the services' log lines would say it twice.
    log = logging.getLogger("autopilot")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)
        for name, value in saved.items():
            setattr(settings, name, value)


@dataclass
class Printed:
    """What the pass has printed so far (history rows are printed once each)."""

    hub_after: int = 0
    goal_after: int = 0
    states: list[str] = field(default_factory=list)


def goals_replace() -> int:
    """Abandon what an earlier demo left open of its goals; the new goal replaces them."""
    open_ = Goal.objects.filter(labels__contains=[GOAL_LABEL]).exclude(
        status__in=[GoalStatus.DONE, GoalStatus.ABANDONED]
    )
    ids = list(open_.values_list("pk", flat=True))
    for goal_id in ids:
        goal_abandon(goal_id=goal_id, by=DEMO_BY, reason="replaced by a new demo goal")
    return len(ids)


def autopilot_pass(out: OutputWrapper, *, timeout: float, own_worker: bool = True) -> Goal:
    """Run the pass; returns the goal as it ended. The hub is paused again afterwards.

    A worker that was already running has its own settings: if its autopilot does not merge
    low-risk changes on its own, the pass approves them in its place (as the setting would)."""
    w = out.write
    started = timezone.now()
    replaced = goals_replace()
    goal = goal_create(
        title="Keep a note of every change to the calculator",
        description="Each change to the calculator gets a short note under notes/.",
        success_criteria="notes/ exists on the main branch and the calculator still imports.",
        verify_commands=["ls notes/", "test -f calc.py"],
        priority=1,
        labels=[GOAL_LABEL],
        by=DEMO_BY,
    )
    w("")
    w(
        f"Autopilot: goal {goal.pk} {goal.title!r} proposed"
        + (f" (replacing {replaced} earlier demo goal(s))" if replaced else "")
    )
    goal_approve(goal_id=goal.pk, by=DEMO_BY)
    printed = Printed(
        hub_after=HubTransition.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
        goal_after=0,
    )
    hub_resume(by=DEMO_BY)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            hub_tick()
            if not own_worker:
                _approve_low_risk(out)
            _print_new(out, goal.pk, printed)
            goal.refresh_from_db()
            if _rested(goal, printed):
                break
            time.sleep(TICK_S)
        else:
            w(f"Autopilot: the pass did not come to rest within {timeout:.0f} s")
    finally:
        hub_pause(by=DEMO_BY, reason="the demo's autopilot pass is over: resume it to continue")
        _print_new(out, goal.pk, printed)
    _print_goal(out, goal, since=started)
    return goal


def _approve_low_risk(out: OutputWrapper) -> None:
    pending = ChangeReview.objects.filter(
        status=ChangeStatus.PENDING, risk=Risk.LOW, quantum__labels__contains=[AUTOPILOT]
    ).values_list("pk", flat=True)
    for change_id in pending:
        try:
            change_approve(change_id=change_id, by=f"{DEMO_BY} (auto-merge for the demo)")
        except TetherError as exc:
            out.write(f"  demo: change {change_id} not approved: {exc}")


def _rested(goal: Goal, printed: Printed) -> bool:
    """The goal ended, the hub improved, and it rests with nothing left to do."""
    if goal.status not in (GoalStatus.DONE, GoalStatus.FAILED):
        return False
    return HubState.IMPROVING in printed.states and hub_get().state == HubState.RESTING


def _print_new(out: OutputWrapper, goal_id: int, printed: Printed) -> None:
    """The hub's and the goal's new history rows, in the order they happened."""
    lines: list[tuple[datetime, str]] = []
    for t in HubTransition.objects.filter(pk__gt=printed.hub_after).order_by("pk"):
        printed.hub_after = t.pk
        if t.to_state != t.from_state:
            printed.states.append(t.to_state)
        lines.append(
            (
                t.created_at,
                f"  autopilot: {t.from_state or '-'} -> {t.to_state} ({t.by}): {t.reason}",
            )
        )
    for g in GoalTransition.objects.filter(goal_id=goal_id, pk__gt=printed.goal_after).order_by(
        "pk"
    ):
        printed.goal_after = g.pk
        lines.append(
            (g.created_at, f"  goal {goal_id}: {g.from_status or '-'} -> {g.to_status}: {g.reason}")
        )
    for _, line in sorted(lines, key=lambda item: item[0]):
        out.write(line.rstrip().replace("\n\n", "\n").replace("\n", "\n      "))


def _print_goal(out: OutputWrapper, goal: Goal, *, since: datetime) -> None:
    w = out.write
    w("")
    w(f"Goal {goal.pk} ended {goal.status}: {goal.reason}")
    if goal.epic_id is None:
        return
    for q in Quantum.objects.filter(parent_id=goal.epic_id).order_by("pk"):
        review = ChangeReview.objects.filter(quantum_id=q.pk).order_by("-pk").first()
        change = f"change {review.pk} {review.status}" if review else "no change"
        w(f"  #{q.pk} {shorten(q.title, 50)!r} [{q.status}] {change}")
    findings = Finding.objects.filter(last_seen__gte=since).select_related("quantum")
    w(f"What the scanners found on this pass: {len(findings)} finding(s)")
    for f in findings.order_by("path", "line"):
        where = f"{f.path}:{f.line}" if f.line else f.path
        if f.filed_at is not None and f.filed_at >= since and f.quantum is not None:
            fate = f"filed as #{f.quantum.pk} [{f.quantum.status}]"
        else:
            fate = f"not filed: {f.skipped or 'already filed'}"
        w(f"  {f.scanner} {where}: {shorten(f.message, 50)!r} — {fate}")
    w(
        "Inspect: manage.py goals show ID | manage.py autopilot history | the Goals page and the "
        "autopilot card in the control room"
    )
