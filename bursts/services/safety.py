"""The safety net (beat, every few seconds): finds what event-driven advancement missed.

- a stage whose agents all ended but whose run did not advance within the heartbeat TTL (a lost
  chord callback) -> step;
- a stage with no sign of life: no lease in Redis, no recent heartbeat in Postgres, and an
  agent that had started (a dead worker or host) or nothing dispatched or finished within the
  grace (a message lost with Redis) -> sent to Celery again; the stage tasks' leases make the
  duplicate harmless;
- an agent past its stage timeout -> cancelled (it stops at its next turn; the stage fails);
- a wave whose burst drained without anyone noticing -> advanced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from bursts.canvas import StageDispatch, stages_send_unsafe
from bursts.events import BurstEventType, StageRedispatched, burst_event
from bursts.leases import lease_alive
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.agent_runs import agent_run_time_out
from bursts.services.quantum_runs import quantum_run_redispatch
from bursts.services.runs import run_step
from bursts.services.stages import StageStatus, slots_latest, stage_evaluate, stage_spec
from bursts.services.waves import wave_advance, waves_running_ids
from quanta.pipeline_models import StageMode

logger = logging.getLogger(__name__)


@dataclass
class SafetyReport:
    waves: int = 0
    advanced: list[int] = field(default_factory=list)  # run ids stepped
    redispatched: list[int] = field(default_factory=list)  # run ids re-sent
    timed_out: list[int] = field(default_factory=list)  # agent run ids cancelled


def _remaining(run: QuantumRun) -> tuple[int, ...]:
    spec = stage_spec(run)
    latest, _ = slots_latest(run.pk, run.current_stage)
    positions = range(len(spec["agents"]))
    not_done = [p for p in positions if p not in latest or latest[p].status != AgentStatus.DONE]
    if spec["mode"] == StageMode.SEQUENTIAL and not_done:
        return tuple(range(not_done[0], len(spec["agents"])))
    return tuple(not_done)


def _check_run(
    run: QuantumRun, agents: list[AgentRun], leased: set[int], report: SafetyReport
) -> None:
    """`agents`: the rows of the run's current stage; `leased`: the agent runs whose lease in
    Redis is held (both read once for the whole wave)."""
    now = timezone.now()
    ttl = timedelta(seconds=settings.BURSTS_HEARTBEAT_TTL_S)
    if stage_evaluate(run, agents).status != StageStatus.IN_PROGRESS:
        # The stage ended: the task of its last agent (a chain's last link, a chord callback)
        # steps the run, after a wait in the queue when workers are busy. Only a step that has
        # not come within the heartbeat TTL was lost, with a worker or with Redis.
        ended = max((a.finished_at for a in agents if a.finished_at), default=None)
        if ended is None or ended < now - ttl:
            stepped = run_step(quantum_run_id=run.pk, stage_index=run.current_stage)
            if stepped not in (None, StageStatus.IN_PROGRESS):  # not a step that came meanwhile
                report.advanced.append(run.pk)
        return
    spec = stage_spec(run)
    if spec["timeout_s"]:
        limit = now - timedelta(seconds=spec["timeout_s"])
        for agent in agents:
            late = (
                agent.status == AgentStatus.RUNNING
                and agent.started_at
                and agent.started_at < limit
            )
            if late and agent_run_time_out(
                agent_run_id=agent.pk, error=f"timed out after {spec['timeout_s']} s", now=now
            ):
                report.timed_out.append(agent.pk)
    for agent in agents:
        if agent.status == AgentStatus.WAITING or agent.pk in leased:
            return
        if (
            agent.status == AgentStatus.RUNNING
            and agent.heartbeat_at
            and agent.heartbeat_at > now - ttl
        ):
            return
    # An agent that started and then went silent (no lease, no heartbeat within the TTL) died
    # with its worker or host: its stage goes again now. Otherwise the stage's tasks may still
    # be waiting in the queue behind other work: they get the dispatch grace first.
    died = any(a.status == AgentStatus.RUNNING for a in agents)
    activity = [run.dispatched_at] + [a.finished_at for a in agents]
    last = max((t for t in activity if t is not None), default=None)
    grace = timedelta(seconds=settings.BURSTS_DISPATCH_GRACE_S)
    if not died and last is not None and last > now - grace:
        return
    # Compare-and-set on dispatched_at: two safety nets never re-send the same stage twice.
    if not quantum_run_redispatch(run_id=run.pk, dispatched_at=run.dispatched_at, now=now):
        return
    positions = _remaining(run)
    logger.warning(
        "run %s stage %s shows no sign of life: sending positions %s again",
        run.pk,
        run.current_stage,
        positions,
    )
    burst_event(
        BurstEventType.STAGE_REDISPATCHED,
        StageRedispatched(
            wave_id=run.wave_id, run_id=run.pk, stage=run.current_stage, positions=list(positions)
        ),
    )
    stages_send_unsafe([StageDispatch(run.pk, run.current_stage, spec["mode"], positions)])
    report.redispatched.append(run.pk)


# The safety net reads a wave's running runs this many at a time.
SAFETY_CHUNK = 1_000


def _check_runs(runs: list[QuantumRun], report: SafetyReport) -> None:
    stages: dict[int, list[AgentRun]] = {run.pk: [] for run in runs}
    current = AgentRun.objects.filter(
        quantum_run_id__in=list(stages),
        quantum_run__status=RunStatus.RUNNING,
        stage_index=F("quantum_run__current_stage"),
        parent__isnull=True,  # the stage's slots; a sub-agent lives and ends with its parent
    )
    for agent in current:
        stages[agent.quantum_run_id].append(agent)  # type: ignore[index]
    live = [a.pk for agents in stages.values() for a in agents if a.status == AgentStatus.RUNNING]
    leased = lease_alive(live)
    for run in runs:
        try:
            _check_run(run, stages[run.pk], leased, report)
        except Exception:
            logger.exception("safety net: run %s", run.pk)


def safety_net() -> SafetyReport:
    """Each running wave in three reads per SAFETY_CHUNK running runs (the runs, the agents of
    their current stages, their leases in one MGET): a tick's statements and memory do not grow
    with the wave beyond that; only what needs action costs more."""
    report = SafetyReport()
    for wave_id in waves_running_ids():
        report.waves += 1
        after = 0
        while True:
            runs = list(
                QuantumRun.objects.filter(
                    wave_id=wave_id, status=RunStatus.RUNNING, pk__gt=after
                ).order_by("pk")[:SAFETY_CHUNK]
            )
            if runs:
                after = runs[-1].pk
                _check_runs(runs, report)
            if len(runs) < SAFETY_CHUNK:
                break
        wave_advance(wave_id=wave_id)
    return report
