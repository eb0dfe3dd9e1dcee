"""The registry of running agents in Redis (id, phase, worker, heartbeat): hot state only.

Postgres is the truth. If Redis loses the hash (flush, restart), the first reader finds the
`built` marker gone and rebuilds the registry from the live AgentRun rows.
"""

from __future__ import annotations

import json
from typing import TypedDict

from django.utils import timezone

from annihilation.redis import get_redis
from bursts.models import AgentRun, AgentStatus

KEY = "agents:registry"
BUILT = "agents:registry:built"
_LIVE = (AgentStatus.PENDING, AgentStatus.RUNNING, AgentStatus.WAITING)


class RegistryEntry(TypedDict):
    agent_run_id: int
    agent_id: str
    attempt: int
    status: str
    phase: str
    worker: str
    heartbeat: str


def _entry(run: AgentRun) -> RegistryEntry:
    beat = run.heartbeat_at or timezone.now()
    return {
        "agent_run_id": run.pk,
        "agent_id": run.agent_id,
        "attempt": run.attempt,
        "status": run.status,
        "phase": run.phase,
        "worker": run.worker,
        "heartbeat": beat.isoformat(),
    }


def registry_put(entry: RegistryEntry) -> None:
    get_redis().hset(KEY, str(entry["agent_run_id"]), json.dumps(entry))


def registry_remove(agent_run_id: int) -> None:
    get_redis().hdel(KEY, str(agent_run_id))


def registry_rebuild() -> int:
    """Reload every live agent run from Postgres; returns how many are registered."""
    client = get_redis()
    runs = AgentRun.objects.filter(status__in=_LIVE).only(
        "id", "agent_id", "attempt", "status", "phase", "worker", "heartbeat_at"
    )
    pipe = client.pipeline()
    pipe.delete(KEY)
    count = 0
    for run in runs.iterator():
        pipe.hset(KEY, str(run.pk), json.dumps(_entry(run)))
        count += 1
    pipe.set(BUILT, "1")
    pipe.execute()
    return count


def registry_list() -> list[RegistryEntry]:
    client = get_redis()
    if not client.exists(BUILT):
        registry_rebuild()
    entries: list[RegistryEntry] = [json.loads(v) for v in client.hvals(KEY)]
    return sorted(entries, key=lambda e: e["agent_run_id"])


def registry_sync(run: AgentRun) -> None:
    """Mirror one run: registered while live, removed once terminal."""
    if run.status in _LIVE:
        registry_put(_entry(run))
    else:
        registry_remove(run.pk)
