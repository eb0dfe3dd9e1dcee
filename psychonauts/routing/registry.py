"""The registry of running agents in Redis (id, phase, worker and its host, heartbeat): hot
state only.

Postgres is the truth. If Redis loses the hash (flush, restart), the first reader finds the
`built` marker gone and rebuilds the registry from the live AgentRun rows.

Agents change phase several times a turn, a hundred of them in a threads worker: their threads
only note the change (`_Mirror`), and this process's live-events thread writes what has been
noted, one pipeline for all the runs that changed meanwhile.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TypedDict

import redis.asyncio
from django.conf import settings
from django.db.models import CharField, Count, F, Func, Value
from django.utils import timezone
from redis.typing import EncodableT, FieldT

from bursts.models import AGENT_LIVE, AgentRun, AgentStatus
from core.events import flush_live, run_later
from core.redis import get_redis
from core.workers import worker_host, workers_by_host

KEY = "agents:registry"
BUILT = "agents:registry:built"


class RegistryEntry(TypedDict):
    agent_run_id: int
    agent_id: str
    attempt: int
    status: str
    phase: str
    worker: str
    host: str  # the worker's host (ANNIHILATION_HOST); "" while pending
    heartbeat: str


class HostLine(TypedDict):
    """One host of the dashboard: the Celery workers heard from there, the agents it runs."""

    host: str
    workers: list[str]  # node names
    agents_running: int


# An agent run's host in SQL: its worker up to the first colon (`core.workers.worker_host`).
_HOST = Func(F("worker"), Value(":"), Value(1), function="split_part", output_field=CharField())


def _entry(run: AgentRun) -> RegistryEntry:
    beat = run.heartbeat_at or timezone.now()
    return {
        "agent_run_id": run.pk,
        "agent_id": run.agent_id,
        "attempt": run.attempt,
        "status": run.status,
        "phase": run.phase,
        "worker": run.worker,
        "host": worker_host(run.worker),
        "heartbeat": beat.isoformat(),
    }


class _Mirror:
    """This process's registry writes, coalesced: the latest entry (None: removed) of each run
    that changed since the last write."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._noted: dict[str, str | None] = {}
        self._client: redis.asyncio.Redis | None = None  # the live-events thread's own

    def note(self, agent_run_id: int, entry: str | None) -> None:
        with self._lock:
            first = not self._noted
            self._noted[str(agent_run_id)] = entry
        if first:  # else the write queued by the first note has not taken them yet
            run_later(self._write)

    async def _write(self) -> None:
        with self._lock:
            noted, self._noted = self._noted, {}
        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        pipe = self._client.pipeline(transaction=False)
        puts: dict[FieldT, EncodableT] = {r: e for r, e in noted.items() if e is not None}
        if puts:
            pipe.hset(KEY, mapping=puts)
        if removed := [run for run, entry in noted.items() if entry is None]:
            pipe.hdel(KEY, *removed)
        await pipe.execute()


_mirror = _Mirror()
# A forked child (prefork worker) has a live-events thread of its own, and needs a client too.
os.register_at_fork(after_in_child=_mirror.reset)


def registry_put(entry: RegistryEntry) -> None:
    _mirror.note(entry["agent_run_id"], json.dumps(entry))


def registry_remove(agent_run_id: int) -> None:
    _mirror.note(agent_run_id, None)


def registry_rebuild() -> int:
    """Reload every live agent run from Postgres; returns how many are registered."""
    client = get_redis()
    runs = AgentRun.objects.filter(status__in=AGENT_LIVE).only(
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
    flush_live()  # this process's own notes first
    client = get_redis()
    if not client.exists(BUILT):
        registry_rebuild()
    entries: list[RegistryEntry] = [json.loads(v) for v in client.hvals(KEY)]
    for entry in entries:  # an entry a process of an earlier release wrote
        entry.setdefault("host", worker_host(entry["worker"]))
    return sorted(entries, key=lambda e: e["agent_run_id"])


def registry_hosts() -> list[HostLine]:
    """Every host with a worker heard from lately or an agent running, by name: a host whose
    workers went quiet while its agents still run shows them with no worker.

    The agents are counted in Postgres, one grouped query through the `agentrun_live` index
    (cheaper than decoding the Redis registry): the dashboard asks at each burst event."""
    workers = workers_by_host()
    running: dict[str, int] = dict(
        AgentRun.objects.filter(status=AgentStatus.RUNNING)
        .annotate(on_host=_HOST)
        .values("on_host")
        .annotate(n=Count("id"))
        .values_list("on_host", "n")
    )
    running.pop("", None)  # resumed, not yet taken by a worker
    return [
        {"host": host, "workers": workers.get(host, []), "agents_running": running.get(host, 0)}
        for host in sorted(workers.keys() | running.keys())
    ]


def registry_sync(run: AgentRun) -> None:
    """Mirror one run: registered while live, removed once terminal."""
    if run.status in AGENT_LIVE:
        registry_put(_entry(run))
    else:
        registry_remove(run.pk)
