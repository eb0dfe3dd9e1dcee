"""Stages of a run: evaluate where a stage stands, begin the next one, build agent context."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Max
from django.utils import timezone

from bursts.canvas import StageDispatch, stages_send
from bursts.context import PriorResult, context_thread
from bursts.models import AgentRun, AgentStatus, QuantumRun, RunStatus
from quanta.models import Quantum
from quanta.pipeline_models import StageMode
from quanta.pipelines.conditions import BadCondition, condition_holds
from quanta.pipelines.spec import StageSpec

LIVE_AGENT: frozenset[str] = frozenset(
    {AgentStatus.PENDING, AgentStatus.RUNNING, AgentStatus.WAITING}
)


class StageStatus(enum.StrEnum):
    """Where a stage stands after an agent finishes (the seed's four answers)."""

    IN_PROGRESS = "in_progress"  # agents still running (or a retry is owed): wait
    ALL_SUCCEEDED = "all_succeeded"  # advance to the next stage, or the run is done
    HAS_FAILURES = "has_failures"  # a fan-out agent failed after its retries: run error
    SEQUENTIAL_BLOCKED = "sequential_blocked"  # a sequential agent failed: the chain is broken


def stage_spec(run: QuantumRun, index: int | None = None) -> StageSpec:
    stages: list[StageSpec] = run.pipeline_snapshot["stages"]
    return stages[run.current_stage if index is None else index]


def agent_id_for(quantum_id: int, stage_index: int, role: str, nth: int) -> str:
    """The seed's `<quantum>_s<stage>_<role>`; a role repeated in one stage gets `_2`, `_3`."""
    base = f"{quantum_id}_s{stage_index}_{role}"
    return base if nth == 1 else f"{base}_{nth}"


def slots_latest(run_id: int, stage_index: int) -> tuple[dict[int, AgentRun], dict[int, int]]:
    """The latest attempt per position of a stage, and how many attempts each has had."""
    latest: dict[int, AgentRun] = {}
    attempts: dict[int, int] = {}
    for agent in AgentRun.objects.filter(quantum_run_id=run_id, stage_index=stage_index).order_by(
        "position", "attempt"
    ):
        latest[agent.position] = agent
        attempts[agent.position] = attempts.get(agent.position, 0) + 1
    return latest, attempts


@dataclass(frozen=True)
class StageVerdict:
    status: StageStatus
    reason: str = ""


def stage_evaluate(run: QuantumRun) -> StageVerdict:
    spec = stage_spec(run)
    latest, attempts = slots_latest(run.pk, run.current_stage)
    allowed = 1 + spec["retries"]
    failures: list[str] = []
    for position in range(len(spec["agents"])):
        agent = latest.get(position)
        if agent is None or agent.status in LIVE_AGENT:
            return StageVerdict(StageStatus.IN_PROGRESS)
        if agent.status == AgentStatus.DONE:
            continue
        if agent.status == AgentStatus.ERROR and attempts[position] < allowed:
            return StageVerdict(StageStatus.IN_PROGRESS)  # a retry is owed
        why = f"agent {agent.agent_id} {agent.status} after {attempts[position]} attempt(s)"
        if agent.error:
            why += f": {agent.error}"
        if spec["mode"] == StageMode.SEQUENTIAL:
            return StageVerdict(StageStatus.SEQUENTIAL_BLOCKED, why)
        failures.append(why)
    if failures:
        return StageVerdict(StageStatus.HAS_FAILURES, "; ".join(failures))
    return StageVerdict(StageStatus.ALL_SUCCEEDED)


def condition_names(quantum: Quantum) -> dict[str, Any]:
    return {
        "labels": list(quantum.labels),
        "kind": quantum.kind,
        "complexity": quantum.complexity,
        "priority": quantum.priority,
        "title": quantum.title,
    }


def stage_record(run: QuantumRun, index: int, status: str, reason: str = "") -> None:
    """Set the stage's entry in run.stages (caller saves)."""
    name = stage_spec(run, index)["name"]
    entries = [e for e in run.stages if e["index"] != index]
    entries.append({"index": index, "name": name, "status": status, "reason": reason})
    run.stages = sorted(entries, key=lambda e: e["index"])


def stages_begin(
    items: Sequence[tuple[QuantumRun, int]],
    quanta: dict[int, Quantum],
    *,
    create: Sequence[QuantumRun] = (),
) -> list[tuple[QuantumRun, str]]:
    """Start each run at the first stage from the given index whose condition holds.

    Creates the stage's AgentRuns, saves the runs and sends the stages after commit. Runs not
    yet in the database are passed in `create` too: they are inserted with their first stage
    already set (one INSERT instead of an UPDATE per run).
    Returns the runs that have no stage left to run, with `done` or `error` (a condition that
    cannot be evaluated), for the caller to finish. Call with the wave locked.
    """
    now = timezone.now()
    finished: list[tuple[QuantumRun, str]] = []
    planned: list[tuple[QuantumRun, StageSpec]] = []
    for run, start in items:
        stages: list[StageSpec] = run.pipeline_snapshot["stages"]
        names = condition_names(quanta[run.quantum_id])
        index = start
        failed = ""
        while index < len(stages):
            try:
                if condition_holds(stages[index]["condition"], names):
                    break
            except BadCondition as exc:
                failed = f"stage {index} {stages[index]['name']}: {exc}"
                break
            stage_record(run, index, "skipped", f"condition false: {stages[index]['condition']}")
            index += 1
        if failed:
            run.error_reason = failed
            finished.append((run, RunStatus.ERROR))
        elif index >= len(stages):
            finished.append((run, RunStatus.DONE))
        else:
            run.current_stage = index
            planned.append((run, stages[index]))
    for run, spec in planned:
        stage_record(run, spec["index"], "running")
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or now
        run.dispatched_at = now
    if create:
        QuantumRun.objects.bulk_create(create, batch_size=500)
    elif len(items) == 1:
        items[0][0].save(update_fields=_RUN_FIELDS)
    else:
        QuantumRun.objects.bulk_update([run for run, _ in items], _RUN_FIELDS, batch_size=100)
    # Attempts continue across runs of the same quantum (agent_id + attempt is unique).
    new_agents: list[AgentRun] = []
    wanted: list[tuple[QuantumRun, StageSpec, int, str, dict[str, Any]]] = []
    for run, spec in planned:
        seen: dict[str, int] = {}
        for position, agent in enumerate(spec["agents"]):
            seen[agent["role"]] = seen.get(agent["role"], 0) + 1
            aid = agent_id_for(run.quantum_id, spec["index"], agent["role"], seen[agent["role"]])
            wanted.append((run, spec, position, aid, agent["settings"]))
    previous = dict(
        AgentRun.objects.filter(agent_id__in=[w[3] for w in wanted])
        .values("agent_id")
        .annotate(top=Max("attempt"))
        .values_list("agent_id", "top")
    )
    for run, spec, position, aid, settings in wanted:
        new_agents.append(
            AgentRun(
                agent_id=aid,
                attempt=previous.get(aid, 0) + 1,
                quantum_id=run.quantum_id,
                quantum_run=run,
                stage_index=spec["index"],
                position=position,
                role=spec["agents"][position]["role"],
                provider=str(settings.get("provider", "")),
                model=str(settings.get("model", "")),
            )
        )
    AgentRun.objects.bulk_create(new_agents)
    dispatches = [
        StageDispatch(run.pk, spec["index"], spec["mode"], tuple(range(len(spec["agents"]))))
        for run, spec in planned
    ]
    stages_send(dispatches)
    return finished


_RUN_FIELDS = ["current_stage", "stages", "status", "started_at", "dispatched_at", "error_reason"]


def agent_context(agent: AgentRun, mode: str) -> str:
    """Earlier stages' results, plus (sequential) the earlier agents of this stage."""
    if agent.stage_index == 0 and (mode != StageMode.SEQUENTIAL or agent.position == 0):
        return ""  # nothing came before: spare the query
    rows = (
        AgentRun.objects.filter(
            quantum_run_id=agent.quantum_run_id,
            stage_index__lte=agent.stage_index,
            status=AgentStatus.DONE,
        )
        .order_by("stage_index", "position", "attempt")
        .values_list("stage_index", "position", "agent_id", "result")
    )
    last: dict[tuple[int, int], PriorResult] = {}
    for stage_index, position, agent_id, result in rows:
        if stage_index == agent.stage_index and (
            mode != StageMode.SEQUENTIAL or position >= agent.position
        ):
            continue
        last[(stage_index, position)] = PriorResult(stage_index, agent_id, result)
    return context_thread(last[key] for key in sorted(last))
