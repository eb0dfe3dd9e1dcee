"""What the pages show of environments: the repositories whose environment failed to build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.db.models import F
from django.db.models.functions import Coalesce

from psychonauts.environments.models import BuildStatus, EnvironmentBuild
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
        EnvironmentFailure(
            repository=by_path[build.repository],
            build_id=build.pk,
            key=build.key[:12],
            host=build.host,
            error=build.error or "the build failed",
            log_tail=build.log[-LOG_TAIL_CHARS:],
        )
        for build in failed
        if build.repository in by_path
    ]
    return sorted(failures, key=lambda f: f.repository)
