"""Celery tasks of the autopilot: thin adapters over its services."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="autopilot.holds_release", ignore_result=True)
def holds_release() -> int:
    """Resume the runs held by a budget that allows again (the hub's tick does it too)."""
    from autopilot.services.budgets import holds_release as release

    return release()


@shared_task(name="autopilot.goal_progress", ignore_result=True)
def goal_progress(goal_id: int) -> int:
    """After a goal's planner run (chained to it): file its plan, try again or fail the goal;
    the hub's tick does the same for every goal (goals_progress)."""
    from autopilot.services.goals.progress import goals_progress

    return goals_progress(goal_id=goal_id)


@shared_task(name="autopilot.goal_verify", acks_late=True, ignore_result=True)
def goal_verify(goal_id: int) -> str:
    """Run a verifying goal's verify commands on the integration branch (idempotent: a goal no
    longer verifying, or being verified by another worker, is left alone)."""
    from autopilot.services.goals.verification import goal_verify as verify

    goal = verify(goal_id=goal_id)
    return goal.status if goal is not None else ""


# --- improving and contemplating ----------------------------------------------------------------


@shared_task(name="autopilot.scan", ignore_result=True)
def scan() -> dict[str, object]:
    """One improving pass: the scanners over the target branch, filing improvement quanta (a
    pass that finds another running returns at once, busy)."""
    from autopilot.services.scanners import scans_run

    return {name: report.as_data() for name, report in scans_run().items()}


@shared_task(name="autopilot.contemplate", ignore_result=True)
def contemplate() -> dict[str, int | None]:
    """Start a contemplator run in each repository, unless one is live there or enough
    proposals wait there (idempotent); each repository's run id, by name."""
    from autopilot.services.contemplation import contemplations_start

    return {
        name: run.pk if run is not None else None for name, run in contemplations_start().items()
    }


# --- the hub ------------------------------------------------------------------------------------


@shared_task(name="autopilot.tick", ignore_result=True)
def tick() -> dict[str, object]:
    """The hub's beat tick: snapshot, decide, record, act (a tick that finds another running
    returns at once)."""
    from autopilot.services.hub import hub_tick

    return dict(vars(hub_tick()))


@shared_task(name="autopilot.wave_start", ignore_result=True)
def wave_start() -> int | None:
    """Start the autopilot's wave unless one runs or nothing is ready (idempotent)."""
    from autopilot.services.hub import autopilot_wave_start

    wave = autopilot_wave_start()
    return wave.pk if wave is not None else None


@shared_task(name="autopilot.goals", ignore_result=True)
def goals(decompose: bool = False) -> int:
    """The goals' step, sent by the tick: start planner runs for approved goals (while
    executing), then the safety net (plans to file, quanta all closed, checks due); how many
    goals moved."""
    from autopilot.services.goals.planning import goals_decompose_due
    from autopilot.services.goals.progress import goals_progress

    started = goals_decompose_due() if decompose else 0
    return started + goals_progress()


@shared_task(name="autopilot.base_check", acks_late=True, ignore_result=True)
def base_check(repository_id: int | None = None) -> int | None:
    """Run a repository's checks on its integration branch (None: the default repository's;
    one at a time per repository; sent when due)."""
    from autopilot.services.healing import base_check_run

    check = base_check_run(repository_id=repository_id)
    return check.pk if check is not None else None
