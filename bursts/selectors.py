"""Reads over waves and runs: listings, the detail an operator follows, progress counters."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypedDict

import redis
from django.conf import settings
from django.db.models import Count, DecimalField, Max, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from bursts.errors import WaveNotFound
from bursts.models import AGENT_LIVE, AgentRun, Burst, QuantumRun, Wave
from core.redis import get_redis

LIVE_AGENTS_SHOWN = 50


class WaveProgress(TypedDict):
    wave_id: int
    status: str
    bursts: int
    runs: dict[str, int]
    agents: dict[str, int]
    stages: dict[str, int]  # "stage name: status" -> runs there


def waves_list(*, limit: int = 50) -> QuerySet[Wave]:
    return Wave.objects.order_by("-id")[:limit]


def wave_get(*, wave_id: int) -> Wave:
    try:
        return Wave.objects.get(pk=wave_id)
    except Wave.DoesNotExist:
        raise WaveNotFound(f"no wave {wave_id}") from None


def wave_status_counts(wave: Wave) -> tuple[dict[str, int], dict[str, int]]:
    """Runs by status and agent runs by status, for one wave (two grouped counts)."""
    runs = dict(wave.runs.values("status").annotate(n=Count("id")).values_list("status", "n"))
    agents = dict(
        AgentRun.objects.filter(quantum_run__wave=wave)
        .values("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return runs, agents


def wave_stats(wave: Wave) -> dict[str, Any]:
    runs, agents = wave_status_counts(wave)
    end = wave.finished_at or timezone.now()
    return {
        "bursts": wave.burst_count,
        "runs": runs,
        "runs_total": sum(runs.values()),
        "agents": agents,
        "agents_total": sum(agents.values()),
        "duration_s": round((end - wave.started_at).total_seconds(), 3),
    }


def wave_progress(*, wave_id: int) -> WaveProgress:
    wave = wave_get(wave_id=wave_id)
    runs, agents = wave_status_counts(wave)
    stages: dict[str, int] = {}
    for run_stages, current in wave.runs.filter(status="running").values_list(
        "stages", "current_stage"
    ):
        for entry in run_stages:
            if entry["index"] == current:
                key = f"{entry['name']}: {entry['status']}"
                stages[key] = stages.get(key, 0) + 1
    return {
        "wave_id": wave.pk,
        "status": wave.status,
        "bursts": wave.burst_count,
        "runs": runs,
        "agents": agents,
        "stages": stages,
    }


def wave_data(wave: Wave) -> dict[str, Any]:
    return {
        "id": wave.pk,
        "status": wave.status,
        "labels": wave.labels,
        "continuous": wave.continuous,
        "max_bursts": wave.max_bursts,
        "bursts": wave.burst_count,
        "error": wave.error,
        "started_by": wave.started_by,
        "started_at": wave.started_at,
        "finished_at": wave.finished_at,
        "stats": wave.stats or wave_stats(wave),
    }


def wave_detail(*, wave_id: int) -> dict[str, Any]:
    """The wave, its bursts, and every run with its stages and agent attempts (3 queries)."""
    wave = wave_get(wave_id=wave_id)
    bursts = list(Burst.objects.filter(wave=wave).order_by("number"))
    runs = list(
        QuantumRun.objects.filter(wave=wave)
        .select_related("quantum", "burst")
        .prefetch_related("agent_runs")
        .order_by("burst__number", "id")
    )
    return {
        **wave_data(wave),
        "burst_list": [
            {
                "number": b.number,
                "phase": b.phase,
                "stats": b.stats,
                "started_at": b.started_at,
                "finished_at": b.finished_at,
            }
            for b in bursts
        ],
        "runs": [
            {
                "id": r.pk,
                "burst": r.burst.number,
                "quantum_id": r.quantum_id,
                "title": r.quantum.title,
                "quantum_status": r.quantum.status,
                "status": r.status,
                "pipeline": r.pipeline_name,
                "pipeline_version": r.pipeline_version,
                "current_stage": r.current_stage,
                "stages": r.stages,
                "error": r.error_reason,
                "agents": [
                    {
                        "agent_run_id": a.pk,
                        "agent_id": a.agent_id,
                        "attempt": a.attempt,
                        "stage": a.stage_index,
                        "role": a.role,
                        "status": a.status,
                        "result": a.result[:500],
                        "error": a.error,
                    }
                    for a in sorted(
                        r.agent_runs.all(), key=lambda a: (a.stage_index, a.position, a.attempt)
                    )
                ],
            }
            for r in runs
        ],
    }


# --- the control room ---------------------------------------------------------------------------


class AgentLine(TypedDict):
    id: int
    agent_id: str
    attempt: int
    role: str
    status: str
    phase: str
    quantum_id: int
    tokens: int


class Spend(TypedDict):
    tokens_in: int
    tokens_out: int
    cost_usd: Decimal


class Dashboard(TypedDict):
    wave: Wave | None
    burst: Burst | None
    runs: dict[str, int]
    runs_total: int
    agents: dict[str, int]
    phases: dict[str, int]
    live_agents: list[AgentLine]
    wave_spend: Spend
    total_spend: Spend
    quanta: dict[str, int]
    queues: dict[str, int | None]


def wave_current() -> Wave | None:
    """The running wave (the newest if several), else the newest wave."""
    return (
        Wave.objects.filter(status="running").order_by("-id").first()
        or Wave.objects.order_by("-id").first()
    )


def _spend(qs: QuerySet[AgentRun]) -> Spend:
    row = qs.aggregate(
        tokens_in=Coalesce(Sum("tokens_in"), 0),
        tokens_out=Coalesce(Sum("tokens_out"), 0),
        cost_usd=Coalesce(Sum("cost_usd"), Decimal(0), output_field=DecimalField()),
    )
    return {
        "tokens_in": int(row["tokens_in"]),
        "tokens_out": int(row["tokens_out"]),
        "cost_usd": Decimal(row["cost_usd"]),
    }


@cache
def _broker(url: str) -> redis.Redis:
    """One client (and connection pool) per broker URL for the process: a client made per
    call paid a new connection on every dashboard render."""
    return redis.Redis.from_url(url, socket_timeout=0.5)


def celery_queue_depths() -> dict[str, int | None]:
    """Messages waiting per Celery queue (Redis LLEN of each queue's list); None if unreachable."""
    from core.celery import app

    names = sorted({q.name for q in (app.conf.task_queues or [])} | {app.conf.task_default_queue})
    try:
        with _broker(settings.CELERY_BROKER_URL).pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(name)
            return dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
    except redis.RedisError:
        return dict.fromkeys(names)


class WaveFigures(TypedDict):
    runs: dict[str, int]
    agents: dict[str, int]
    phases: dict[str, int]  # of the live agents
    spend: Spend


def wave_figures(wave: Wave) -> WaveFigures:
    """A wave's runs by status, its agents by status, its live agents by phase and its spend:
    two grouped statements, whatever the wave's size (the agents are grouped once by status
    and phase with their sums, and the rest is added up here)."""
    runs = dict(wave.runs.values("status").annotate(n=Count("id")).values_list("status", "n"))
    agents: dict[str, int] = {}
    phases: dict[str, int] = {}
    spend: Spend = {"tokens_in": 0, "tokens_out": 0, "cost_usd": Decimal(0)}
    for status, phase, n, tokens_in, tokens_out, cost in (
        AgentRun.objects.filter(quantum_run__wave=wave)
        .values("status", "phase")
        .annotate(
            n=Count("id"),
            tokens_in=Sum("tokens_in"),
            tokens_out=Sum("tokens_out"),
            cost=Sum("cost_usd"),
        )
        .values_list("status", "phase", "n", "tokens_in", "tokens_out", "cost")
    ):
        agents[status] = agents.get(status, 0) + n
        if status in AGENT_LIVE:
            phases[phase] = phases.get(phase, 0) + n
        spend["tokens_in"] += int(tokens_in)
        spend["tokens_out"] += int(tokens_out)
        spend["cost_usd"] += Decimal(cost)
    return {"runs": runs, "agents": agents, "phases": phases, "spend": spend}


def wave_live_agents(wave: Wave, *, limit: int = LIVE_AGENTS_SHOWN) -> list[AgentLine]:
    """The wave's first `limit` live agents by id (live agents are few, a worker's slots bound
    them: the partial `agentrun_live` index finds them however many have ended)."""
    return [
        {
            "id": a["id"],
            "agent_id": a["agent_id"],
            "attempt": a["attempt"],
            "role": a["role"],
            "status": a["status"],
            "phase": a["phase"],
            "quantum_id": a["quantum_id"],
            "tokens": a["tokens_in"] + a["tokens_out"],
        }
        for a in AgentRun.objects.filter(quantum_run__wave=wave, status__in=AGENT_LIVE)
        .order_by("id")
        .values(
            "id",
            "agent_id",
            "attempt",
            "role",
            "status",
            "phase",
            "quantum_id",
            "tokens_in",
            "tokens_out",
        )[:limit]
    ]


class Totals(TypedDict):
    quanta: dict[str, int]
    spend: Spend


TOTALS_KEY = "dashboard:totals:{newest}"


def _totals_count() -> Totals:
    from quanta.models import Quantum

    return {
        "quanta": dict(
            Quantum.objects.values("status").annotate(n=Count("id")).values_list("status", "n")
        ),
        "spend": _spend(AgentRun.objects.all()),
    }


def dashboard_totals() -> Totals:
    """Quanta by status and the spend of every agent ever: the two figures that read whole
    tables (growing with the quanta and every agent run kept).

    They are counted at most once every DASHBOARD_TOTALS_TTL_S seconds for every render and
    process, through Redis, under a key naming the newest quantum (one read of the primary
    key's index): a quantum created shows at once, a status change or a spend within the TTL.
    A TTL of 0 counts them on every render."""
    from quanta.models import Quantum

    ttl = settings.DASHBOARD_TOTALS_TTL_S
    if ttl <= 0:
        return _totals_count()
    newest = Quantum.objects.aggregate(m=Max("id"))["m"] or 0
    key = TOTALS_KEY.format(newest=newest)
    client = get_redis()
    try:
        cached = client.get(key)
    except redis.RedisError:
        cached = None
    if cached is not None:
        raw = json.loads(cached)
        spend = raw["spend"]
        return {
            "quanta": {str(k): int(v) for k, v in raw["quanta"].items()},
            "spend": {
                "tokens_in": int(spend["tokens_in"]),
                "tokens_out": int(spend["tokens_out"]),
                "cost_usd": Decimal(spend["cost_usd"]),
            },
        }
    totals = _totals_count()
    with contextlib.suppress(redis.RedisError):
        client.set(key, json.dumps(totals, default=str), px=max(int(ttl * 1000), 1))
    return totals


def dashboard_summary() -> Dashboard:
    """Everything the dashboard's summary shows: the current wave's figures in a fixed number
    of grouped statements (none per run or agent), the totals through `dashboard_totals`."""
    wave = wave_current()
    burst = wave.bursts.order_by("-number").first() if wave is not None else None
    figures: WaveFigures = {
        "runs": {},
        "agents": {},
        "phases": {},
        "spend": {"tokens_in": 0, "tokens_out": 0, "cost_usd": Decimal(0)},
    }
    live: list[AgentLine] = []
    if wave is not None:
        figures = wave_figures(wave)
        live = wave_live_agents(wave)
    totals = dashboard_totals()
    return {
        "wave": wave,
        "burst": burst,
        "runs": figures["runs"],
        "runs_total": sum(figures["runs"].values()),
        "agents": figures["agents"],
        "phases": figures["phases"],
        "live_agents": live,
        "wave_spend": figures["spend"],
        "total_spend": totals["spend"],
        "quanta": totals["quanta"],
        "queues": celery_queue_depths(),
    }


class TimelineBar(TypedDict):
    label: str
    kind: str  # burst | run
    status: str
    start_s: float
    end_s: float
    running: bool
    run_id: int | None
    quantum_id: int | None


def wave_timeline(*, wave_id: int) -> tuple[Wave, list[TimelineBar], float]:
    """Bursts and runs of a wave as (start, end) seconds since the wave started; and the span."""
    wave = wave_get(wave_id=wave_id)
    now = timezone.now()
    origin = wave.started_at

    def secs(moment: datetime | None) -> float:
        return max(((moment or now) - origin).total_seconds(), 0.0)

    bars: list[TimelineBar] = []
    runs_by_burst: dict[int, list[QuantumRun]] = {}
    for run in (
        QuantumRun.objects.filter(wave=wave).select_related("quantum").order_by("created_at", "id")
    ):
        runs_by_burst.setdefault(run.burst_id, []).append(run)
    for burst in Burst.objects.filter(wave=wave).order_by("number"):
        bars.append(
            {
                "label": f"burst {burst.number}",
                "kind": "burst",
                "status": burst.phase,
                "start_s": secs(burst.started_at),
                "end_s": secs(burst.finished_at),
                "running": burst.finished_at is None,
                "run_id": None,
                "quantum_id": None,
            }
        )
        for run in runs_by_burst.get(burst.pk, []):
            bars.append(
                {
                    "label": f"#{run.quantum_id} {run.quantum.title}"[:60],
                    "kind": "run",
                    "status": run.status,
                    "start_s": secs(run.started_at or run.created_at),
                    "end_s": secs(run.finished_at),
                    "running": run.finished_at is None,
                    "run_id": run.pk,
                    "quantum_id": run.quantum_id,
                }
            )
    span = max([secs(wave.finished_at), *(b["end_s"] for b in bars), 0.001])
    return wave, bars, span


def quantum_runs(*, quantum_id: int) -> list[QuantumRun]:
    """A quantum's runs, newest first, with their agents (two queries)."""
    return list(
        QuantumRun.objects.filter(quantum_id=quantum_id)
        .select_related("wave", "burst")
        .prefetch_related("agent_runs")
        .order_by("-id")[:50]
    )


def agent_run_find(*, agent_run_id: int) -> AgentRun | None:
    return AgentRun.objects.select_related("quantum", "quantum_run").filter(pk=agent_run_id).first()


class VersionUsed(TypedDict):
    version: int
    runs: int
    last: datetime  # when its newest run was created


def pipeline_versions_used() -> dict[str, list[VersionUsed]]:
    """Per pipeline name: each version runs used, with how many runs and when last (one query)."""
    rows = (
        QuantumRun.objects.values("pipeline_name", "pipeline_version")
        .annotate(runs=Count("id"), last=Max("created_at"))
        .order_by("pipeline_name", "-pipeline_version")
    )
    found: dict[str, list[VersionUsed]] = {}
    for row in rows:
        found.setdefault(row["pipeline_name"], []).append(
            {"version": row["pipeline_version"], "runs": row["runs"], "last": row["last"]}
        )
    return found
