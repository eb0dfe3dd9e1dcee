"""Sub-agents: a parent's spawn call runs child agent runs and reads their results."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from django.conf import settings
from django.db import close_old_connections, connection

from bursts.executor import Outcome
from bursts.models import AgentRun, AgentStatus
from psychonauts.errors import SpawnRefused
from psychonauts.models import Role
from psychonauts.routing import semaphore
from psychonauts.runtime.runs import agent_run_children_create
from psychonauts.runtime.tools import SpawnSpec


class Execute(Protocol):
    """Executes one agent run to an outcome: `agent_run_execute`, handed down through the runner.
    It executes the parent whose spawn call lands here, so this module cannot import it."""

    def __call__(self, *, agent_run_id: int) -> Outcome: ...


def agent_spawn(
    *, parent: AgentRun, turn_index: int, specs: list[SpawnSpec], execute: Execute
) -> str:
    """Run sub-agents for a parent's spawn call and return their results as text.

    Children are agent runs of their own (agent id derived from the parent's and the call's
    position, so a resumed parent finds the same children instead of making new ones). They run
    in threads of this process, each holding a slot of the global semaphore while it works; the
    parent gives its own slot back while it waits (see semaphore.py for the deadlock).
    """
    depth = parent.depth + 1
    if depth > settings.PSYCHONAUTS_SPAWN_DEPTH:
        raise SpawnRefused(
            f"depth limit: {parent.agent_id} is at depth {parent.depth}; "
            f"sub-agents may go {settings.PSYCHONAUTS_SPAWN_DEPTH} deep"
        )
    known = set(Role.objects.values_list("name", flat=True))
    for spec in specs:
        if spec["role"] not in known:
            raise SpawnRefused(f"unknown role {spec['role']!r} (known: {sorted(known)})")
    if not AgentRun.objects.filter(pk=parent.pk, status=AgentStatus.RUNNING).exists():
        # Cancelled (its run, stage or wave ended) while its call was on the way: a spawn in
        # flight starts no new sub-agent.
        raise SpawnRefused(f"{parent.agent_id} is no longer running: no sub-agent started")
    children = agent_run_children_create(parent=parent, turn_index=turn_index, specs=specs)

    def run_child(child_id: int) -> Outcome:
        try:
            with semaphore.slot_held(f"agentrun:{child_id}"):
                # Its parent may have ended while this child waited for a slot: the child's
                # first turn looks up its parents and stops it then.
                return execute(agent_run_id=child_id)
        finally:
            if threading.current_thread() is not threading.main_thread():
                connection.close()

    close_old_connections()
    with (
        semaphore.slot_released_while(f"agentrun:{parent.pk}"),
        ThreadPoolExecutor(max_workers=len(children), thread_name_prefix="spawn") as pool,
    ):
        outcomes = list(pool.map(run_child, [c.pk for c in children]))
    sections = []
    for child, outcome in zip(children, outcomes, strict=True):
        body = outcome.result if outcome.status == "done" else f"{outcome.status}: {outcome.error}"
        sections.append(f"### Agent: {child.agent_id} [{outcome.status}]\n{body[:10_000]}")
    return "\n\n".join(sections)
