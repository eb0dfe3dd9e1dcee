"""Stages of a run: evaluate where a stage stands, begin the next one, build agent context."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from django.db import connection
from django.db.models import Max
from django.utils import timezone

from bursts.canvas import StageDispatch, stages_send
from bursts.context import PriorResult, context_thread
from bursts.models import AGENT_LIVE, AgentRun, AgentStatus, QuantumRun, RunStatus
from bursts.services.agent_runs import agent_runs_create
from bursts.services.quantum_runs import quantum_runs_begin, quantum_runs_create
from core.redaction import redact
from core.sql import sql_names
from quanta.models import Quantum
from quanta.pipeline_models import StageMode
from quanta.pipelines.conditions import BadCondition, condition_holds
from quanta.pipelines.spec import StageSpec
from quanta.selectors import quantum_comments

# What a retried attempt is told: why the attempt before it failed, cut to its head and its
# tail (a test run's summary comes last), and the quantum's latest comments (the burst
# manager's note on each failed run among them; a quantum may have hundreds).
FAILURE_HEAD = 2_000
FAILURE_TAIL = 4_000
COMMENTS_SHOWN = 20
COMMENT_LIMIT = 1_500


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


class AgentRow(Protocol):
    """What evaluating a stage and building its context read of an attempt: an AgentRun, or
    the plain row a run step reads."""

    @property
    def agent_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def stage_index(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def result(self) -> str: ...


def slots_latest(run_id: int, stage_index: int) -> tuple[dict[int, AgentRun], dict[int, int]]:
    """The latest attempt per position of a stage, and how many attempts each has had. A
    stage's slots are its top-level agents: a sub-agent carries its parent's run, stage and a
    position of its own among its siblings, and never stands for a slot."""
    return _latest(
        AgentRun.objects.filter(quantum_run_id=run_id, stage_index=stage_index, parent__isnull=True)
    )


@dataclass(frozen=True)
class StageVerdict:
    status: StageStatus
    reason: str = ""


_A = TypeVar("_A", bound=AgentRow)


def _latest(agents: Iterable[_A]) -> tuple[dict[int, _A], dict[int, int]]:
    latest: dict[int, _A] = {}
    attempts: dict[int, int] = {}
    for agent in sorted(agents, key=lambda a: (a.position, a.attempt)):
        latest[agent.position] = agent
        attempts[agent.position] = attempts.get(agent.position, 0) + 1
    return latest, attempts


def stage_evaluate(run: QuantumRun, agents: Sequence[AgentRow] | None = None) -> StageVerdict:
    """Where the run's current stage stands; `agents` are the stage's rows if already loaded."""
    spec = stage_spec(run)
    latest: Mapping[int, AgentRow]
    if agents is None:
        latest, attempts = slots_latest(run.pk, run.current_stage)
    else:
        latest, attempts = _latest(a for a in agents if a.stage_index == run.current_stage)
    allowed = 1 + spec["retries"]
    failures: list[str] = []
    for position in range(len(spec["agents"])):
        agent = latest.get(position)
        if agent is None or agent.status in AGENT_LIVE:
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


@dataclass
class StagePlan:
    """What beginning the next stage of some runs comes to, before anything is written: the
    runs that have no stage left (`done`, or `error` for a condition that cannot be evaluated),
    the runs that begin a stage (their fields set), and the attempts to insert for them."""

    finished: list[tuple[QuantumRun, str]]
    begun: list[tuple[QuantumRun, StageSpec]]
    agents: list[AgentRun]


def stages_begin(
    items: Sequence[tuple[QuantumRun, int]],
    quanta: dict[int, Quantum],
    *,
    create: Sequence[QuantumRun] = (),
    loaded: Mapping[int, Sequence[AgentRow]] | None = None,
    first_runs: Collection[int] = (),
) -> list[tuple[QuantumRun, str]]:
    """Start each run at the first stage from the given index whose condition holds.

    Creates the stage's AgentRuns, saves the runs and sends the stages after commit. Runs not
    yet in the database are passed in `create` too: they are inserted with their first stage
    already set (one INSERT instead of an UPDATE per run). See `stages_plan` for `loaded` and
    `first_runs`. Returns the runs that have no stage left to run, with `done` or `error`, for
    the caller to finish: their skipped stages are recorded in `run.stages` but saved (unless
    in `create`) only by that finish. Call with the runs locked.
    """
    plan = stages_plan(items, quanta, loaded=loaded, first_runs=first_runs, new_runs=bool(create))
    # A run with no stage left is saved by the caller's finish (one UPDATE instead of two).
    if create:
        quantum_runs_create(runs=create)
        for agent in plan.agents:  # built while their runs had no id yet
            run = agent.quantum_run
            assert run is not None
            agent.quantum_run_id = run.pk
    else:
        quantum_runs_begin(runs=[run for run, _ in plan.begun])
    agent_runs_create(agents=plan.agents)
    stages_dispatch(plan)
    return plan.finished


def stages_plan(
    items: Sequence[tuple[QuantumRun, int]],
    quanta: dict[int, Quantum],
    *,
    loaded: Mapping[int, Sequence[AgentRow]] | None = None,
    first_runs: Collection[int] = (),
    new_runs: bool = False,
) -> StagePlan:
    """Plan each run's start at the first stage from the given index whose condition holds:
    the skipped stages are recorded in `run.stages`, a run that begins a stage gets its
    fields, and its attempts are built (not inserted). The agents that can know their context
    now (all of a fan-out stage, a chain's first link) get it, from the runs' agent rows in
    `loaded` (run id -> rows) or one query. `first_runs` are runs known to be their quantum's
    only one (no earlier attempts to number after); `new_runs`: the runs are not in the
    database yet (no earlier results to thread)."""
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
    # Attempts continue across runs of the same quantum (agent_id + attempt is unique).
    new_agents: list[AgentRun] = []
    wanted: list[tuple[QuantumRun, StageSpec, int, str, dict[str, Any]]] = []
    for run, spec in planned:
        seen: dict[str, int] = {}
        for position, agent in enumerate(spec["agents"]):
            seen[agent["role"]] = seen.get(agent["role"], 0) + 1
            aid = agent_id_for(run.quantum_id, spec["index"], agent["role"], seen[agent["role"]])
            wanted.append((run, spec, position, aid, agent["settings"]))
    # A quantum on its first run has no earlier attempts: spare the query.
    asked = [w[3] for w in wanted if w[0].pk not in first_runs]
    previous = (
        dict(
            AgentRun.objects.filter(agent_id__in=asked)
            .values("agent_id")
            .annotate(top=Max("attempt"))
            .values_list("agent_id", "top")
        )
        if asked
        else {}
    )
    contexts = _contexts(
        [(run, spec["index"]) for run, spec in planned if spec["index"] > 0 and not new_runs],
        loaded,
    )
    for run, spec, position, aid, settings in wanted:
        known = spec["mode"] == StageMode.FAN_OUT or position == 0
        context = contexts.get(run.pk, "") if known else ""
        if known and aid in previous:  # a new run of a quantum whose earlier run failed
            context = _joined(context, retry_notes(run.quantum_id, aid, previous[aid] + 1))
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
                context=context,
                task_id=str(uuid.uuid4()),
            )
        )
    return StagePlan(finished=finished, begun=planned, agents=new_agents)


def stages_dispatch(plan: StagePlan) -> None:
    """Send the begun stages once the transaction commits (their attempts inserted, ids set)."""
    sent: dict[int, list[AgentRun]] = {}
    for created in plan.agents:  # in position order per run
        sent.setdefault(created.quantum_run_id or 0, []).append(created)
    stages_send(
        [
            StageDispatch(
                run.pk,
                spec["index"],
                spec["mode"],
                tuple(range(len(spec["agents"]))),
                tuple(a.pk for a in sent[run.pk]),
                tuple(a.task_id for a in sent[run.pk]),
            )
            for run, spec in plan.begun
        ]
    )


def _thread(rows: Iterable[tuple[int, int, str, str]], stage_index: int, before: int) -> str:
    """Context from done (stage, position, agent_id, result) rows in (stage, position, attempt)
    order: earlier stages, plus this stage's positions before `before`; the last done attempt
    of each slot."""
    last: dict[tuple[int, int], PriorResult] = {}
    for stage, position, agent_id, result in rows:
        if stage > stage_index or (stage == stage_index and position >= before):
            continue
        last[(stage, position)] = PriorResult(stage, agent_id, result)
    return context_thread(last[key] for key in sorted(last))


def _contexts(
    items: Sequence[tuple[QuantumRun, int]], loaded: Mapping[int, Sequence[AgentRow]] | None
) -> dict[int, str]:
    """run id -> the context of a stage about to begin (the earlier stages' results)."""
    if not items:
        return {}
    rows: dict[int, list[tuple[int, int, str, str]]] = {}
    if loaded is not None and all(run.pk in loaded for run, _ in items):
        for run, _ in items:
            done = [a for a in loaded[run.pk] if a.status == AgentStatus.DONE]
            done.sort(key=lambda a: (a.stage_index, a.position, a.attempt))
            rows[run.pk] = [(a.stage_index, a.position, a.agent_id, a.result) for a in done]
    else:
        for run_id, *row in (
            AgentRun.objects.filter(
                quantum_run_id__in=[run.pk for run, _ in items],
                status=AgentStatus.DONE,
                parent__isnull=True,
            )
            .order_by("stage_index", "position", "attempt")
            .values_list("quantum_run_id", "stage_index", "position", "agent_id", "result")
        ):
            rows.setdefault(run_id, []).append(tuple(row))  # type: ignore[arg-type]
    return {run.pk: _thread(rows.get(run.pk, []), index, before=0) for run, index in items}


# The rows a chain link's context is built from: the run's done attempts up to its stage, and
# the link's own attempts (its latest names it). Plain SQL: the ORM compiled this filter in more
# time than the query took, once per chain link.
_PRIOR_ROWS = """
SELECT {stage_index}, {position}, {agent_id}, {result}, {status}, {attempt}, {quantum_id}
FROM {table}
WHERE {quantum_run_id} = %(run)s AND {parent_id} IS NULL
  AND (({status} = 'done' AND {stage_index} <= %(stage)s)
       OR ({stage_index} = %(stage)s AND {position} = %(position)s))
ORDER BY {stage_index}, {position}, {attempt}
""".format(**sql_names(AgentRun))


def prior_results_context(run_id: int, stage_index: int, *, before_position: int) -> str:
    """The context of the chain link at `before_position`: earlier stages' results and this
    stage's results before it, and, when the link is a retry, why its last attempt failed and
    the quantum's comments."""
    with connection.cursor() as cursor:
        cursor.execute(
            _PRIOR_ROWS, {"run": run_id, "stage": stage_index, "position": before_position}
        )
        rows = cursor.fetchall()
    done: list[tuple[int, int, str, str]] = []
    link: tuple[int, str, int] | None = None  # (quantum id, agent id, attempt) of the latest
    for stage, position, agent_id, result, status, attempt, quantum_id in rows:
        if status == AgentStatus.DONE:
            done.append((stage, position, agent_id, result))
        if (stage, position) == (stage_index, before_position):
            link = (quantum_id, agent_id, attempt)
    thread = _thread(done, stage_index, before_position)
    return _joined(thread, retry_notes(*link) if link is not None else "")


def agent_context(agent: AgentRun, mode: str) -> str:
    """Earlier stages' results, plus (sequential) the earlier agents of this stage; for a retry,
    why the last attempt failed and the quantum's comments."""
    notes = retry_notes(agent.quantum_id, agent.agent_id, agent.attempt)
    if agent.stage_index == 0 and (mode != StageMode.SEQUENTIAL or agent.position == 0):
        return notes  # nothing came before: spare the query
    if agent.quantum_run_id is None:
        return notes  # a standalone agent (CLI): no stages
    before = agent.position if mode == StageMode.SEQUENTIAL else 0
    rows = (
        AgentRun.objects.filter(
            quantum_run_id=agent.quantum_run_id,
            stage_index__lte=agent.stage_index,
            status=AgentStatus.DONE,
            parent__isnull=True,
        )
        .order_by("stage_index", "position", "attempt")
        .values_list("stage_index", "position", "agent_id", "result")
    )
    return _joined(_thread(rows, agent.stage_index, before), notes)


def _joined(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)


def _cut(text: str) -> str:
    """Long text as its head and its tail, with how much was left out between them."""
    if len(text) <= FAILURE_HEAD + FAILURE_TAIL:
        return text
    left_out = len(text) - FAILURE_HEAD - FAILURE_TAIL
    return (
        f"{text[:FAILURE_HEAD]}\n[... {left_out} characters left out ...]\n{text[-FAILURE_TAIL:]}"
    )


def retry_notes(quantum_id: int, agent_id: str, attempt: int) -> str:
    """What attempt `attempt` of an agent is told about the tries before it: why the attempt
    before it failed (its error; its result when the error says nothing, as for a failed
    verdict), whether in this run or in an earlier run of the quantum, and the quantum's latest
    comments, newest last. "" for a first attempt. Redacted, as everything the model reads."""
    if attempt <= 1:
        return ""
    parts: list[str] = []
    last = (
        AgentRun.objects.filter(agent_id=agent_id, attempt__lt=attempt)
        .order_by("-attempt")
        .values("attempt", "status", "error", "result", "quantum_run_id")
        .first()
    )
    if last is not None and last["status"] in (AgentStatus.ERROR, AgentStatus.CANCELLED):
        why = (last["error"] or last["result"] or "(no reason was recorded)").strip()
        parts.append(
            f"## Why the previous attempt failed\n"
            f"Attempt {last['attempt']} of {agent_id} (quantum run {last['quantum_run_id']}) "
            f"ended {last['status']}. Do not repeat what made it fail:\n{_cut(why)}"
        )
    # The newest few, and one more to know whether older ones were left out.
    comments = list(
        quantum_comments(quantum_id=quantum_id)
        .reverse()
        .values_list("created_at", "author", "author_kind", "body")[: COMMENTS_SHOWN + 1]
    )
    if comments:
        more = len(comments) > COMMENTS_SHOWN
        shown = comments[:COMMENTS_SHOWN][::-1]
        head = f"## Comments on the quantum ({'the latest ' if more else ''}{len(shown)}, oldest first)"
        lines = [head]
        for created_at, author, author_kind, body in shown:
            text = body if len(body) <= COMMENT_LIMIT else body[:COMMENT_LIMIT] + " [...]"
            lines.append(f"- {created_at:%Y-%m-%d %H:%M} {author} ({author_kind}): {text}")
        parts.append("\n".join(lines))
    return redact("\n\n".join(parts))
