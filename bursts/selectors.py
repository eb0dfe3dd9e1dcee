"""Reads over waves and runs: listings, the detail an operator follows, progress counters."""

from __future__ import annotations

from typing import Any, TypedDict

from django.db.models import Count, QuerySet
from django.utils import timezone

from bursts.errors import WaveNotFound
from bursts.models import AgentRun, Burst, QuantumRun, Wave


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
