"""The hub: the autopilot's state machine, and the one writer of Hub and HubTransition.

A beat tick (`hub_tick`, task `autopilot.tick`) takes a snapshot, decides the state with the
predicates, records a change with its reason and the snapshot, then acts: it sends work to
Celery after commit (never long work inside the tick). The operator pauses, resumes or forces a
state (`hub_pause`, `hub_resume`, `hub_force`); each is a history row too.

Ticks serialise on the hub's row: a tick locks it without waiting (`SKIP LOCKED`) and a tick
that finds it held returns at once, so two ticks never act twice. The global spending cap
pauses the hub (reason "global spend cap ..."); the tick lifts that pause, and only that one,
once the cap no longer holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autopilot.errors import InvalidHubCommand
from autopilot.events import HubEventType, hub_event
from autopilot.labels import AUTOPILOT
from autopilot.models import Hub, HubState, HubTransition
from autopilot.predicates import (
    Decision,
    contemplation_due,
    decide,
    needs_healing,
    needs_wave,
    scan_due,
)
from autopilot.services import healing
from autopilot.snapshot import Snapshot, snapshot_with
from autopilot.spend import CapStatus, cap_status, usd_text
from bursts.models import Wave, WaveStatus
from bursts.services.waves import wave_start
from core.celery import app
from core.sql import sql_names
from quanta.selectors import quanta_ready
from repos.services import default_repository_id

logger = logging.getLogger(__name__)

TICK = "tick"
CAP_PAUSE = "global spend cap"
STARTED_BY = "autopilot"

# The tasks the tick sends (by name: the tick never imports the tasks module).
SCAN_TASK = "autopilot.scan"
CONTEMPLATE_TASK = "autopilot.contemplate"
WAVE_TASK = "autopilot.wave_start"
GOALS_TASK = "autopilot.goals"
BASE_CHECK_TASK = "autopilot.base_check"
HOLDS_TASK = "autopilot.holds_release"


@dataclass(frozen=True)
class Tick:
    """What one tick did."""

    state: str
    reason: str
    changed: bool = False  # the state (or the pause) changed
    paused: bool = False
    skipped: bool = False  # another tick held the hub
    sent: tuple[str, ...] = ()  # the tasks sent after commit
    healed: tuple[str, ...] = ()  # the healing actions taken


# --- reading and locking the row ----------------------------------------------------------------


def hub_get() -> Hub:
    """The hub's row (made on first use: a flushed test database has none)."""
    hub, _ = Hub.objects.get_or_create(pk=1)
    return hub


def _hub_locked() -> Hub:
    """The row, locked for this transaction (waiting for a tick that holds it)."""
    hub_get()
    return Hub.objects.select_for_update().get(pk=1)


def cap_words(cap: CapStatus | Snapshot) -> str:
    if isinstance(cap, Snapshot):
        spent, limit = cap.cap_spent_usd, cap.cap_usd
    else:
        spent, limit = cap.spent_usd, cap.cap_usd
    return f"{CAP_PAUSE} {usd_text(spent)} of {usd_text(limit or 0)} reached"


# --- history -----------------------------------------------------------------------------------


def _record(
    hub: Hub,
    *,
    from_state: str,
    reason: str,
    by: str,
    snapshot: dict[str, Any] | None = None,
    kind: HubEventType = "state_changed",
) -> None:
    """A history row and its event (sent after commit)."""
    HubTransition.objects.create(
        from_state=from_state,
        to_state=hub.state,
        reason=reason,
        by=by,
        snapshot=snapshot or {},
    )
    hub_event(
        kind,
        {
            "from": from_state,
            "to": hub.state,
            "reason": reason,
            "by": by,
            "paused": hub.paused,
            "paused_reason": hub.paused_reason,
            "forced": hub.forced,
        },
    )


def _save(hub: Hub, expected_state: str, **changes: Any) -> None:
    """Write `changes` to the locked row (compare-and-set on the state it was read in)."""
    updated = Hub.objects.filter(pk=1, state=expected_state).update(**changes)
    if updated != 1:  # the row is locked by this transaction: only a bug gets here
        raise InvalidHubCommand(f"the hub changed under its lock (expected {expected_state})")
    for name, value in changes.items():
        setattr(hub, name, value)


# --- the operator's commands --------------------------------------------------------------------


@transaction.atomic
def hub_pause(*, by: str, reason: str = "") -> Hub:
    """Pause the autopilot (ticks then only record that they ran)."""
    hub = _hub_locked()
    why = reason.strip() or f"paused by {by}"
    _save(hub, hub.state, paused=True, paused_reason=why)
    _record(hub, from_state=hub.state, reason=f"paused by {by}: {why}", by=by, kind="paused")
    return hub


@transaction.atomic
def hub_resume(*, by: str) -> Hub:
    """Let the autopilot decide again: lifts a pause and a forced state. Refused while the
    global spending cap is reached (the next tick would pause it again)."""
    hub = _hub_locked()
    if not hub.paused and not hub.forced:
        return hub
    cap = cap_status()
    if cap.reached:
        raise InvalidHubCommand(
            f"the {cap_words(cap)}: raise SPEND_CAP_DAY_USD or wait for tomorrow to resume"
        )
    was = "paused" if hub.paused else f"forced to {hub.state}"
    _save(hub, hub.state, paused=False, paused_reason="", forced=False)
    _record(hub, from_state=hub.state, reason=f"resumed by {by} (was {was})", by=by, kind="resumed")
    return hub


@transaction.atomic
def hub_force(*, state: str, by: str) -> Hub:
    """Put the hub in `state` and keep it there (ticks act in it) until resumed. A paused hub
    runs again in that state; refused while the global spending cap is reached."""
    if state not in HubState.values:
        raise InvalidHubCommand(
            f"unknown state {state!r}: the states are {', '.join(HubState.values)}"
        )
    hub = _hub_locked()
    cap = cap_status()
    if cap.reached:
        raise InvalidHubCommand(f"the {cap_words(cap)}: no state can be forced")
    before = hub.state
    reason = f"forced to {state} by {by}"
    _save(
        hub,
        before,
        state=state,
        reason=reason,
        forced=True,
        paused=False,
        paused_reason="",
        since=timezone.now(),
    )
    _record(hub, from_state=before, reason=reason, by=by, kind="forced")
    return hub


# --- the tick -----------------------------------------------------------------------------------


def _send_unsafe(name: str, expires: float, kwargs: dict[str, Any]) -> None:
    """Send a task now (hence `unsafe`: only after commit). A broker outage is logged: the next
    tick decides again."""
    try:
        app.send_task(name, kwargs=kwargs, expires=expires)
    except Exception:
        logger.warning("autopilot: could not send %s", name, exc_info=True)


def _send(name: str, sent: list[str], **kwargs: Any) -> None:
    # A task not taken within a few ticks is stale: the ticks since sent what was due then.
    expires = max(float(settings.AUTOPILOT_TICK_S) * 3, 30.0)
    transaction.on_commit(lambda: _send_unsafe(name, expires, kwargs))
    sent.append(name)


# The tick's hub row, read by the snapshot's own statement: locked unless another tick holds it
# (then no row: that tick is acting) and stamped with the tick's time. A tick that changes
# nothing is then one statement and the budgets' one.
_TICK_CTE = """locked AS (
    SELECT {id} FROM {table} WHERE {id} = 1 FOR UPDATE SKIP LOCKED
), h AS (
    UPDATE {table} SET {tick_at} = %(tick_at)s WHERE {id} IN (SELECT {id} FROM locked)
    RETURNING *
)""".format(**sql_names(Hub))


def _snapshot_locked(now: datetime) -> Snapshot | None:
    """The snapshot with the hub's row locked and stamped; None when another tick holds it."""
    snap = snapshot_with(hub_cte=_TICK_CTE, params={"tick_at": now}, now=now)
    if snap is None and not Hub.objects.filter(pk=1).exists():
        hub_get()  # a database without the row (flushed): make it, then lock it
        snap = snapshot_with(hub_cte=_TICK_CTE, params={"tick_at": now}, now=now)
    return snap


def hub_tick() -> Tick:
    """Snapshot, decide, record, act. Idempotent; a tick that finds another holding the hub
    returns at once (`skipped`)."""
    now = timezone.now()
    sent: list[str] = []
    with transaction.atomic():
        snap = _snapshot_locked(now)
        if snap is None:
            return Tick(state="", reason="another tick holds the hub", skipped=True)
        hub = Hub(
            pk=1,
            state=snap.state,
            reason=snap.reason,
            paused=snap.paused,
            paused_reason=snap.paused_reason,
            forced=snap.forced,
            scanned_at=snap.scanned_at,
            contemplated_at=snap.contemplated_at,
            tick_at=now,
        )
        changed = False
        # The global cap pauses the hub; lifting it lifts only its own pause.
        if snap.cap_reached and not hub.paused:
            why = cap_words(snap)
            _save(hub, hub.state, paused=True, paused_reason=why)
            _record(hub, from_state=hub.state, reason=why, by=TICK, snapshot=snap.as_data(),
                    kind="paused")  # fmt: skip
            changed = True
        elif hub.paused and hub.paused_reason.startswith(CAP_PAUSE) and not snap.cap_reached:
            why = (
                f"the global spend cap no longer holds: {usd_text(snap.cap_spent_usd)} spent today"
                + (f" of {usd_text(snap.cap_usd)}" if snap.cap_usd is not None else " (no cap)")
            )
            _save(hub, hub.state, paused=False, paused_reason="")
            _record(hub, from_state=hub.state, reason=why, by=TICK, snapshot=snap.as_data(),
                    kind="resumed")  # fmt: skip
            changed = True
        if hub.paused:
            # Budget holds are not the hub's to keep: the operator's own work held by the cap
            # resumes once the cap allows, paused hub or not.
            if snap.holds:
                _send(HOLDS_TASK, sent)
            return Tick(
                state=hub.state,
                reason=hub.paused_reason,
                changed=changed,
                paused=True,
                sent=tuple(sent),
            )

        decision = Decision(hub.state, hub.reason) if hub.forced else decide(snap)
        changes: dict[str, Any] = {}
        if decision.state != hub.state:
            changes.update(state=decision.state, reason=decision.reason, since=now)
        elif decision.reason != hub.reason:
            changes["reason"] = decision.reason
        state = decision.state
        # Due checked again: a forced state keeps its rhythm.
        if state == HubState.IMPROVING and scan_due(snap):
            changes["scanned_at"] = now
            _send(SCAN_TASK, sent)
        elif state == HubState.CONTEMPLATING and contemplation_due(snap):
            changes["contemplated_at"] = now
            _send(CONTEMPLATE_TASK, sent)
        before = hub.state
        if changes:
            _save(hub, before, **changes)
        if before != state:
            _record(hub, from_state=before, reason=decision.reason, by=TICK,
                    snapshot=snap.as_data())  # fmt: skip
            changed = True

        # Healing that costs nothing (cancelling stuck agents, marking endpoints down, filing
        # the healing quantum, which waits for its budget like any work) happens in any state.
        healed = tuple(healing.healing_act(snap)) if needs_healing(snap) else ()
        if state == HubState.EXECUTING and needs_wave(snap):
            _send(WAVE_TASK, sent)
        # Decomposition while executing; the goals' safety net in every state (plans to file,
        # quanta all closed, checks due). One message for both: a send is the tick's dearest step.
        decompose = state == HubState.EXECUTING and snap.goals_approved > 0
        if decompose or snap.goals_decomposing or snap.goals_active or snap.goals_verifying:
            _send(GOALS_TASK, sent, decompose=decompose)
        # Each repository's checks on their own rhythm, one task per repository.
        for base in healing.bases_due(snap):
            repository_id = base.repository_id or default_repository_id()
            if healing.base_check_claim(snap, repository_id=repository_id):
                _send(BASE_CHECK_TASK, sent, repository_id=repository_id)
        # Runs a budget held: resumed by the budgets' task once their budget allows again.
        if snap.holds:
            _send(HOLDS_TASK, sent)
    return Tick(
        state=state,
        reason=decision.reason,
        changed=changed,
        sent=tuple(sent),
        healed=healed,
    )


# --- the autopilot's wave -----------------------------------------------------------------------


def autopilot_wave_running(*, repository_id: int | None = None) -> int | None:
    """The running wave that covers autopilot quanta (scoped to them, or to everything), of one
    repository (None: of any)."""
    running = Wave.objects.filter(status=WaveStatus.RUNNING)
    if repository_id is not None:
        running = running.filter(repository_id=repository_id)
    for wave_id, labels in running.values_list("pk", "labels"):
        if not labels or AUTOPILOT in labels:
            return int(wave_id)
    return None


def autopilot_wave_start() -> Wave | None:
    """Start a wave scoped to `autopilot` in a repository with ready autopilot quanta that no
    running wave covers, unless the hub is paused or not executing. Serialised on the hub's
    row, so two deliveries start one wave; a repository per call (the next tick starts the
    next repository's)."""
    with transaction.atomic():
        hub = _hub_locked()
        if hub.paused or hub.state != HubState.EXECUTING:
            return None
        ready_in = (
            quanta_ready(labels=[AUTOPILOT])
            .order_by()
            .values_list("repository_id", flat=True)
            .distinct()
        )
        for repository_id in sorted(ready_in):
            if autopilot_wave_running(repository_id=repository_id) is not None:
                continue
            # Batch: each burst closes its barrier and drains before the next collects what
            # the last one unblocked (and what decompositions filed meanwhile).
            wave = wave_start(
                labels=[AUTOPILOT], started_by=STARTED_BY, repository_id=repository_id
            )
            hub_event(
                "wave_started",
                {"wave_id": wave.pk, "labels": [AUTOPILOT], "repository_id": repository_id},
            )
            return wave
    return None


__all__ = [
    "CAP_PAUSE",
    "Tick",
    "autopilot_wave_running",
    "autopilot_wave_start",
    "hub_force",
    "hub_get",
    "hub_pause",
    "hub_resume",
    "hub_tick",
]
