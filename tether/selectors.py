"""Reads of the tether app: what the grounding queue, the commands and the UI show."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, TypedDict

import redis
import yaml
from django.db import connection
from django.db.models import Case, IntegerField, QuerySet, Value, When

from psychonauts.workspaces.diffs import DiffLine, diff_by_path, diff_line
from quanta.pipeline_models import Pipeline
from quanta.pipelines.loader import pipelines_parse
from quanta.pipelines.services import pipeline_spec
from quanta.pipelines.spec import STAGE_DEFAULTS, PipelineSpec
from tether.errors import NotFound
from tether.models import (
    CHANGE_IN_QUEUE,
    PRIORITY_RANK,
    ChangeReview,
    ChangeStatus,
    Drift,
    DriftStatus,
    PipelineMutation,
    Reaching,
    ReachingStatus,
)
from tether.queue import queue_ids, queue_remove_unsafe


def _rank() -> Case:
    return Case(
        *[When(priority=p, then=Value(r)) for p, r in PRIORITY_RANK.items()],
        default=Value(9),
        output_field=IntegerField(),
    )


def reachings_pending(*, limit: int = 200) -> list[Reaching]:
    """Pending questions in queue order: critical > high > normal > low, then earliest deadline.

    The order comes from the Redis queue (rebuilt from Postgres if Redis lost it); if Redis is
    unreachable, the same order straight from Postgres.
    """
    try:
        ids = queue_ids(limit)
    except redis.RedisError:
        return list(
            Reaching.objects.filter(status=ReachingStatus.PENDING)
            .select_related("quantum", "agent_run")
            .order_by(_rank(), "deadline")[:limit]
        )
    rows = {
        r.pk: r
        for r in Reaching.objects.filter(pk__in=ids, status=ReachingStatus.PENDING).select_related(
            "quantum", "agent_run"
        )
    }
    stale = [pk for pk in ids if pk not in rows]
    if stale:
        queue_remove_unsafe(stale)  # resolved meanwhile: the set forgets them
    return [rows[pk] for pk in ids if pk in rows]


def reaching_get(*, reaching_id: int) -> Reaching:
    reaching = (
        Reaching.objects.select_related("quantum", "agent_run").filter(pk=reaching_id).first()
    )
    if reaching is None:
        raise NotFound(f"no reaching #{reaching_id}")
    return reaching


def drifts_list(*, status: str | None = None, limit: int = 200) -> QuerySet[Drift]:
    """Drifts, newest first; `status` filters (open = the grounding queue)."""
    rows = Drift.objects.select_related("reaching", "quantum", "agent_run", "correction")
    if status:
        rows = rows.filter(status=status)
    return rows.order_by("-created_at")[:limit]


def drift_get(*, drift_id: int) -> Drift:
    drift = (
        Drift.objects.select_related("reaching", "quantum", "agent_run", "correction")
        .filter(pk=drift_id)
        .first()
    )
    if drift is None:
        raise NotFound(f"no drift #{drift_id}")
    return drift


def changes_list(*, status: str | None = None, limit: int = 200) -> QuerySet[ChangeReview]:
    """Change reviews: pending first (oldest first, as a queue), then the decided, newest first.
    The diff is deferred: a list never loads it."""
    rows = ChangeReview.objects.select_related("quantum").defer("diff")
    if status:
        rows = rows.filter(status=status)
    pending_first = Case(
        When(status=ChangeStatus.PENDING, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    return rows.order_by(pending_first, "created_at")[:limit]


def merge_queue_list(*, limit: int = 200) -> list[ChangeReview]:
    """The merge queue in the order it is served: the entry merging, then the queued ones by
    approval (the index change_in_queue serves it). The diff is deferred."""
    return list(
        ChangeReview.objects.select_related("quantum")
        .defer("diff")
        .filter(status__in=CHANGE_IN_QUEUE)
        .order_by("queued_at", "pk")[:limit]
    )


def change_get(*, change_id: int) -> ChangeReview:
    """A change review without its diff (a list row)."""
    change = (
        ChangeReview.objects.select_related("quantum").defer("diff").filter(pk=change_id).first()
    )
    if change is None:
        raise NotFound(f"no change review #{change_id}")
    return change


@dataclass(frozen=True)
class ChangeFile:
    """A file of a change review: git's counts and status, and its part of the stored diff."""

    path: str
    status: str
    additions: int
    deletions: int
    diff: str  # its part of the stored diff; "" when the size limit cut it off
    lines: list[DiffLine]  # the diff's lines as the change page shows them


@dataclass(frozen=True)
class ChangeDetail:
    review: ChangeReview
    files: list[ChangeFile]


def change_detail(*, change_id: int) -> ChangeDetail:
    """A change with its (redacted) diff split per file, in the order git listed the files."""
    review = ChangeReview.objects.select_related("quantum").filter(pk=change_id).first()
    if review is None:
        raise NotFound(f"no change review #{change_id}")
    patches = diff_by_path(review.diff)
    files = []
    for f in review.files:
        patch = patches.get(f["path"])
        files.append(
            ChangeFile(
                path=f["path"],
                status=f["status"],
                additions=f["additions"],
                deletions=f["deletions"],
                diff=patch.text if patch else "",
                lines=patch.lines if patch else [],
            )
        )
    return ChangeDetail(review, files)


def pipeline_yaml(spec: PipelineSpec) -> str:
    """A pipeline spec in the YAML form the loader reads (pipelines/*.yaml)."""
    doc: dict[str, Any] = {"name": spec["name"]}
    if spec["description"]:
        doc["description"] = spec["description"]
    if spec["is_default"]:
        doc["default"] = True
    match = {
        k: v for k, v in (("labels", spec["match_labels"]), ("kinds", spec["match_kinds"])) if v
    }
    if match:
        doc["match"] = match
    stages = []
    for s in spec["stages"]:
        stage: dict[str, Any] = {"name": s["name"]}
        if s["mode"] != "sequential":
            stage["mode"] = s["mode"]
        stage["agents"] = [
            a["role"] if not a["settings"] else {"role": a["role"], **a["settings"]}
            for a in s["agents"]
        ]
        if s["condition"]:
            stage["condition"] = s["condition"]
        if s["retries"]:
            stage["retries"] = s["retries"]
        if s["timeout_s"]:
            stage["timeout"] = s["timeout_s"]
        for key, default in STAGE_DEFAULTS.items():
            value = s.get(key, default)
            if value != default:
                stage[key] = value
        stages.append(stage)
    doc["stages"] = stages
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@dataclass(frozen=True)
class MutationView:
    mutation: PipelineMutation
    current_version: int | None
    current_yaml: str  # "" for a new pipeline


def mutation_diff(view: MutationView) -> list[DiffLine]:
    """The proposal against the pipeline as it is now, line by line. Both sides are written in
    the same form (`pipeline_yaml`) first: an agent's flow lists, comments or key order are not
    changes, and only the lines whose meaning differs are marked. A proposal that no longer
    parses is compared as written."""
    proposed = view.mutation.proposed_yaml
    specs, problems = pipelines_parse(proposed, source="proposal", roles=None)
    if not problems and len(specs) == 1:
        proposed = pipeline_yaml(specs[0][1])
    label = f"current v{view.current_version}" if view.current_version else "(new pipeline)"
    lines = difflib.unified_diff(
        view.current_yaml.splitlines(), proposed.splitlines(), label, "proposed", lineterm=""
    )
    # The first two lines are the `---`/`+++` header; a removed `--- x` line further on is not.
    return [diff_line(line) for n, line in enumerate(lines) if n >= 2]


def mutations_list(*, status: str | None = None, limit: int = 100) -> list[MutationView]:
    """Proposals (pending first) each with the pipeline as it is now, for a side-by-side view."""
    rows = PipelineMutation.objects.select_related("agent_run", "quantum")
    if status:
        rows = rows.filter(status=status)
    pending_first = Case(
        When(status="pending", then=Value(0)), default=Value(1), output_field=IntegerField()
    )
    mutations = list(rows.order_by(pending_first, "-created_at")[:limit])
    names = {m.pipeline_name for m in mutations}
    pipelines = {
        p.name: p for p in Pipeline.objects.filter(name__in=names).prefetch_related("stages")
    }
    views = []
    for m in mutations:
        p = pipelines.get(m.pipeline_name)
        current = (
            pipeline_yaml(pipeline_spec(p, sorted(p.stages.all(), key=lambda s: s.index)))
            if p
            else ""
        )
        views.append(MutationView(m, p.version if p else None, current))
    return views


def mutation_exists(*, mutation_id: int) -> bool:
    return PipelineMutation.objects.filter(pk=mutation_id).exists()


class TetherCounts(TypedDict):
    reachings: int
    drifts: int
    changes: int


def tether_counts() -> TetherCounts:
    """What waits for the operator, in one round trip (the dashboard re-reads it on every tether
    event): three counts served by the partial pending index and the status indexes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT (SELECT count(*) FROM {Reaching._meta.db_table} WHERE status = %s),
                       (SELECT count(*) FROM {Drift._meta.db_table} WHERE status = %s),
                       (SELECT count(*) FROM {ChangeReview._meta.db_table} WHERE status = %s)""",
            [ReachingStatus.PENDING.value, DriftStatus.OPEN.value, ChangeStatus.PENDING.value],
        )
        reachings, drifts, changes = cursor.fetchone() or (0, 0, 0)
    return {"reachings": reachings, "drifts": drifts, "changes": changes}


def quantum_drifts(*, quantum_id: int) -> QuerySet[Drift]:
    """A quantum's drifts, newest first (the quantum detail page)."""
    return (
        Drift.objects.filter(quantum_id=quantum_id)
        .select_related("reaching", "correction")
        .order_by("-created_at")
    )


def quantum_changes(*, quantum_id: int) -> QuerySet[ChangeReview]:
    """A quantum's change reviews, newest first, without their diffs."""
    return ChangeReview.objects.filter(quantum_id=quantum_id).defer("diff").order_by("-created_at")
