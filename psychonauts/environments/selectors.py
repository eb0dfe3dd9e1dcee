"""What the pages show of environments: the repositories whose environment failed to build, and
what stands between a quantum's agents and their environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.db.models import F
from django.db.models.functions import Coalesce

from bursts.models import AgentRun, AgentStatus
from psychonauts.environments.models import BuildStatus, EnvironmentBuild, EnvironmentWaiter
from repos.context import target_of
from repos.models import Repository

LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class EnvironmentFailure:
    """A repository whose latest environment build failed: its agents do not start until the
    operator rebuilds it."""

    repository: str  # the repository's name
    build_id: int
    key: str
    host: str
    error: str
    log_tail: str  # the end of setup's redacted output


def _local(repository: Repository) -> str:
    """The path a build of `repository` records: its location, or this host's clone of it."""
    target = target_of(repository)
    return str(Path(target.location) if not target.url else target.clone)


def environments_failed() -> list[EnvironmentFailure]:
    """The live repositories whose most recent environment build (on any host, by when it was
    last started) failed, by repository name. A failed build later rebuilt, or followed by a
    newer key that built, is not one. One query when none failed (the dashboard's case)."""
    latest = (
        EnvironmentBuild.objects.order_by(
            "repository", Coalesce(F("started_at"), F("created_at")).desc(), "-pk"
        )
        .distinct("repository")
        .values("pk")
    )
    failed = list(EnvironmentBuild.objects.filter(pk__in=latest, status=BuildStatus.FAILED))
    if not failed:
        return []
    by_path = {_local(r): r.name for r in Repository.objects.filter(removed_at__isnull=True)}
    failures = [
        _failure(by_path[build.repository], build)
        for build in failed
        if build.repository in by_path
    ]
    return sorted(failures, key=lambda f: f.repository)


def _failure(name: str, build: EnvironmentBuild) -> EnvironmentFailure:
    return EnvironmentFailure(
        repository=name,
        build_id=build.pk,
        key=build.key[:12],
        host=build.host,
        error=build.error or "the build failed",
        log_tail=build.log[-LOG_TAIL_CHARS:],
    )


def environment_failed(*, repository_id: int) -> EnvironmentFailure | None:
    """The repository's most recent environment build when it failed (as environments_failed
    judges it, for one repository)."""
    repository = Repository.objects.filter(pk=repository_id).first()
    if repository is None:
        return None
    build = (
        EnvironmentBuild.objects.filter(repository=_local(repository))
        .order_by(Coalesce(F("started_at"), F("created_at")).desc(), "-pk")
        .first()
    )
    if build is None or build.status != BuildStatus.FAILED:
        return None
    return _failure(repository.name, build)


@dataclass(frozen=True)
class EnvironmentWait:
    """A quantum's agents suspended until their repository's environment is built."""

    build_id: int
    key: str
    host: str
    agents: tuple[str, ...]  # the waiting agents' ids


@dataclass(frozen=True)
class QuantumEnvironment:
    """Why a quantum's agents do not run for their environment: its repository's build failed
    (they do not start), or builds they wait on."""

    failure: EnvironmentFailure | None
    waits: tuple[EnvironmentWait, ...]


def quantum_environment(*, quantum_id: int, repository_id: int | None) -> QuantumEnvironment | None:
    """What the quantum page says of its environment; None when nothing stands in the way."""
    failed = environment_failed(repository_id=repository_id) if repository_id else None
    waiting = list(
        EnvironmentWaiter.objects.filter(
            agent_run_id__in=AgentRun.objects.filter(
                quantum_id=quantum_id, status=AgentStatus.WAITING
            ).values("pk"),
            build__status=BuildStatus.BUILDING,
        )
        .select_related("build")
        .order_by("build_id", "agent_run_id")
    )
    agent_ids = dict(
        AgentRun.objects.filter(pk__in=[w.agent_run_id for w in waiting]).values_list(
            "pk", "agent_id"
        )
    )
    waits: dict[int, EnvironmentWait] = {}
    for waiter in waiting:
        build = waiter.build
        known = waits.get(build.pk)
        agents = (*(known.agents if known else ()), agent_ids.get(waiter.agent_run_id, "?"))
        waits[build.pk] = EnvironmentWait(build.pk, build.key[:12], build.host, agents)
    if failed is None and not waits:
        return None
    return QuantumEnvironment(failure=failed, waits=tuple(waits.values()))
