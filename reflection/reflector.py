"""The reflector: the `reflector` role reads each quantum run of a burst (the session of every
agent that worked on it) through the provider layer, scripted offline and Claude when
configured, and answers with diary entries for those agents, stored as their diary.

Its answer is untrusted model output. An answer that is not JSON, too long, or not an object
of `entries` is recorded (an event on `reflection:extracting` with the reason) and skipped
whole; an entry with unknown fields, an unknown kind, an empty or overlong text, or a role that
did not work on the quantum run (a lesson without evidence) is recorded and skipped alone. A
quantum run already read keeps its entries: reading the burst again writes nothing twice.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bursts.models import AgentRun, QuantumRun
from core.models import Event, Session
from psychonauts.errors import INFRASTRUCTURE, PsychonautError
from psychonauts.events import agent_event_type
from psychonauts.models import DiaryEntry, DiaryKind, DiarySource
from psychonauts.routing.providers.base import RunInfo
from psychonauts.runtime.diary import DiaryNote, diary_add_extracted
from psychonauts.runtime.oneshot import role_complete
from reflection.events import reflection_event

logger = logging.getLogger(__name__)

ROLE = "reflector"
TRANSCRIPT_MAX = 24_000  # characters of one quantum run's sessions sent to the reflector
AGENT_MAX = 8_000  # characters of one agent's session within it
EVENT_MAX = 600  # characters of one event
ANSWER_MAX = 32_000  # characters: a longer answer is malformed
ENTRIES_MAX = 10
ENTRY_TEXT_MAX = 500
ENTRY_KEYS = frozenset({"role", "kind", "text"})
SKIPPED_EVENTS = frozenset({"phase", "delta"})
# Quantum runs read at a time, with their agents: a burst of 10,000 runs (60,000 agent rows) is
# never held in a worker at once, and a worker keeps whatever its peak made it allocate.
RUNS_AT_ONCE = 200
_FENCE = re.compile(r"^```(?:json)?\s*\n(.*)\n```\s*$", re.DOTALL)


@dataclass
class Extraction:
    """What reading a burst's quantum runs did."""

    quantum_runs: int = 0  # read by the reflector now
    entries: int = 0  # diary entries written
    skipped: int = 0  # answers and entries refused
    errors: int = 0  # calls that failed
    tokens_in: int = 0
    tokens_out: int = 0
    problems: list[str] = field(default_factory=list)


# What the reflector reads instead of an error infrastructure caused: nothing it could turn into
# a rule for agents.
INFRASTRUCTURE_LINE = "ended by an infrastructure failure (not the agent's doing: no lesson)"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _event_line(name: str, payload: dict[str, Any]) -> str:
    kind = agent_event_type(name)
    if kind == "text":
        return f"said: {payload.get('text', '')}"
    if kind == "tool_call":
        args = json.dumps(payload.get("input", {}), ensure_ascii=False, sort_keys=True)
        return f"called {payload.get('name', '?')} {args}"
    if kind == "tool_result":
        mark = " (error)" if payload.get("is_error") else ""
        return f"{payload.get('name', '?')} returned{mark}: {payload.get('output', '')}"
    if kind == "verdict":
        return f"verdict {payload.get('verdict', '?')}: {payload.get('reasons', '')}"
    if kind == "error":
        if str(payload.get("error", "")).startswith(INFRASTRUCTURE):
            return INFRASTRUCTURE_LINE
        return f"error: {payload.get('error', '')}"
    return f"{name}: {json.dumps(payload, ensure_ascii=False, sort_keys=True)}"


def transcript(quantum_run: QuantumRun, agents: Sequence[AgentRun]) -> str:
    """The quantum run as the reflector reads it: the quantum, then each agent's session in
    order (its events, clipped), its result or error. Two queries (with the quantum loaded),
    whatever the agents."""
    quantum = quantum_run.quantum
    parts = [f"# Quantum #{quantum.pk}: {quantum.title}"]
    if quantum.labels:
        parts.append("labels: " + ", ".join(quantum.labels))
    if quantum.body:
        parts.append(_clip(quantum.body, 1000))
    sessions = dict(
        Session.objects.filter(
            kind=Session.Kind.AGENT_RUN, ref__in=[str(a.pk) for a in agents]
        ).values_list("ref", "pk")
    )
    events: dict[int, list[tuple[str, object]]] = {}
    for session_id, kind, payload in (
        Event.objects.filter(session_id__in=list(sessions.values()))
        .exclude(type__in=SKIPPED_EVENTS)
        .order_by("session_id", "pk")
        .values_list("session_id", "type", "payload")
    ):
        events.setdefault(session_id, []).append((kind, payload))
    for agent in agents:
        head = (
            f"## Agent {agent.agent_id}: role {agent.role}, attempt {agent.attempt}, "
            f"status {agent.status}"
        )
        lines = [head]
        size = 0
        for kind, payload in events.get(sessions.get(str(agent.pk), -1), []):
            line = "- " + _clip(
                _event_line(kind, payload if isinstance(payload, dict) else {}), EVENT_MAX
            )
            size += len(line)
            if size > AGENT_MAX:
                lines.append("- (the rest of this session is left out)")
                break
            lines.append(line)
        if agent.error.startswith(INFRASTRUCTURE):
            # Not the agent's doing: no lesson for agents is to be drawn from it.
            lines.append(INFRASTRUCTURE_LINE)
        elif agent.error:
            lines.append("error: " + _clip(agent.error, EVENT_MAX))
        elif agent.result:
            lines.append("result: " + _clip(agent.result, EVENT_MAX))
        parts.append("\n".join(lines))
    text = "\n\n".join(parts)
    if len(text) > TRANSCRIPT_MAX:
        text = text[:TRANSCRIPT_MAX] + "\n(the transcript is cut here)"
    return text


def parse_entries(answer: str, agents: Sequence[AgentRun]) -> tuple[list[DiaryNote], list[str]]:
    """The diary notes of a reflector's answer and the problems of what was refused. An entry
    names the role of the agent it is about; it is the diary of that role's last attempt."""
    if len(answer) > ANSWER_MAX:
        return [], [f"the answer is {len(answer)} characters, more than {ANSWER_MAX}"]
    text = answer.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except ValueError as exc:
        return [], [f"the answer is not JSON ({exc}): {_clip(answer, 120)!r}"]
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return [], ['the answer is not an object with a list of "entries"']
    by_role = {a.role: a.pk for a in agents}  # the last attempt of each role
    notes: list[DiaryNote] = []
    problems: list[str] = []
    entries = data["entries"]
    if len(entries) > ENTRIES_MAX:
        problems.append(f"{len(entries)} entries: only the first {ENTRIES_MAX} are read")
    for i, entry in enumerate(entries[:ENTRIES_MAX]):
        where = f"entries[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not an object")
            continue
        unknown = set(entry) - ENTRY_KEYS
        if unknown:
            problems.append(f"{where}: unknown field {sorted(unknown)[0]!r}")
            continue
        role, kind, body = entry.get("role"), entry.get("kind"), entry.get("text")
        if kind not in DiaryKind.values:
            problems.append(f"{where}.kind: {kind!r} is not one of {', '.join(DiaryKind.values)}")
            continue
        if not isinstance(body, str) or not body.strip():
            problems.append(f"{where}.text: empty")
            continue
        if len(body) > ENTRY_TEXT_MAX:
            problems.append(f"{where}.text: {len(body)} characters, more than {ENTRY_TEXT_MAX}")
            continue
        if not isinstance(role, str) or role not in by_role:
            problems.append(
                f"{where}.role: {role!r} did not work on this run "
                f"(roles: {', '.join(sorted(by_role))})"
            )
            continue
        notes.append(DiaryNote(by_role[role], str(kind), body.strip()))
    return notes, problems


def _quantum_runs(burst_id: int) -> Iterator[tuple[QuantumRun, list[AgentRun]]]:
    """The burst's quantum runs the reflector has not read, in order, each with its top-level
    agents in stage order (without their context: the earlier stages' results each was given,
    which the transcript does not show), read RUNS_AT_ONCE runs at a time."""
    ids = list(
        QuantumRun.objects.filter(burst_id=burst_id).order_by("pk").values_list("pk", flat=True)
    )
    for start in range(0, len(ids), RUNS_AT_ONCE):
        agents = list(
            AgentRun.objects.filter(quantum_run_id__in=ids[start : start + RUNS_AT_ONCE], depth=0)
            .defer("context")
            .order_by("quantum_run_id", "stage_index", "position", "attempt", "pk")
        )
        read = set(
            DiaryEntry.objects.filter(
                agent_run__in=agents, source=DiarySource.REFLECTOR
            ).values_list("agent_run__quantum_run_id", flat=True)
        )
        grouped: dict[int, list[AgentRun]] = {}
        for agent in agents:
            if agent.quantum_run_id is not None and agent.quantum_run_id not in read:
                grouped.setdefault(agent.quantum_run_id, []).append(agent)
        runs = QuantumRun.objects.select_related("quantum").in_bulk(list(grouped))
        yield from ((runs[pk], grouped[pk]) for pk in sorted(grouped) if pk in runs)


def reflect_sessions(burst_id: int, *, reflection_run_id: int) -> Extraction:
    """Read every quantum run of the burst not read yet and write its agents' diaries."""
    done = Extraction()
    for quantum_run, agents in _quantum_runs(burst_id):
        last = agents[-1]
        info = RunInfo(
            agent_run_id=last.pk,
            agent_id=f"{quantum_run.quantum_id}_reflect_{ROLE}",
            role=ROLE,
            attempt=1,
            quantum_id=quantum_run.quantum_id,
            labels=tuple(quantum_run.quantum.labels),
        )
        try:
            answer = role_complete(role=ROLE, prompt=transcript(quantum_run, agents), run=info)
        except PsychonautError as exc:
            done.errors += 1
            done.problems.append(f"quantum run {quantum_run.pk}: the reflector failed: {exc}")
            continue
        done.quantum_runs += 1
        done.tokens_in += answer.tokens_in
        done.tokens_out += answer.tokens_out
        notes, problems = parse_entries(answer.text, agents)
        done.skipped += len(problems) if problems else 0
        done.problems.extend(f"quantum run {quantum_run.pk}: {p}" for p in problems)
        diary_add_extracted(notes)
        done.entries += len(notes)
    for problem in done.problems:
        logger.warning("reflection %s: %s", reflection_run_id, problem)
        reflection_event(
            "extracting",
            "reflector_skipped",
            {"reflection_run": reflection_run_id, "burst": burst_id, "problem": problem},
        )
    return done
