"""Writes and reads over pipelines: load from YAML, snapshot for runs, match a quantum."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet

from core.hooks import Hook
from quanta.errors import QuantaError
from quanta.events import quanta_event
from quanta.models import Quantum
from quanta.pipeline_models import Pipeline, Stage
from quanta.pipelines.loader import pipelines_read
from quanta.pipelines.spec import STAGE_DEFAULTS, PipelineSnapshot, PipelineSpec, StageSpec

logger = logging.getLogger(__name__)

SOURCE_MAX = Pipeline._meta.get_field("source").max_length or 500


class PipelineNotFound(QuantaError):
    """No pipeline has that name, or none matches and there is no default."""


class DefaultPipelineTaken(QuantaError):
    """Saving would make `new` the default pipeline in place of `current`, unasked."""

    def __init__(self, *, new: str, current: str) -> None:
        self.new = new
        self.current = current
        super().__init__(
            f"default: pipeline {new!r} would replace {current!r} as the default pipeline"
        )


@dataclass(frozen=True)
class LoadedPipeline:
    name: str
    version: int
    change: str  # created | updated | unchanged
    source: str


def shipped_pipelines_dir() -> Path:
    return Path(settings.BASE_DIR) / "pipelines"


# Where pipeline checks learn which roles exist: the agent runtime, which sits above this app,
# registers its roles table here when the apps load.
RoleNames = Callable[[], Collection[str]]
ROLE_NAMES: Hook[RoleNames] = Hook("quanta.role_names", single=True)


def known_roles() -> frozenset[str] | None:
    """Role names a pipeline's agents may use, or None when no roles are known (then any name
    is accepted)."""
    names = frozenset(name for source in ROLE_NAMES for name in source())
    return names or None


def pipeline_spec(pipeline: Pipeline, stages: Sequence[Stage] | None = None) -> PipelineSpec:
    rows = list(pipeline.stages.order_by("index")) if stages is None else list(stages)
    stage_specs: list[StageSpec] = [
        {
            "index": s.index,
            "name": s.name,
            "mode": s.mode,
            "agents": [
                {"role": a["role"], "settings": dict(a.get("settings") or {})} for a in s.agents
            ],
            "condition": s.condition,
            "retries": s.retries,
            "timeout_s": s.timeout_s,
            "verify": s.verify,
            "verify_retries": s.verify_retries,
            "verdict": s.verdict,
        }
        for s in rows
    ]
    return {
        "name": pipeline.name,
        "description": pipeline.description,
        "match_labels": sorted(pipeline.match_labels),
        "match_kinds": sorted(pipeline.match_kinds),
        "is_default": pipeline.is_default,
        "stages": stage_specs,
    }


def pipeline_snapshot(pipeline: Pipeline) -> PipelineSnapshot:
    spec = pipeline_spec(pipeline)
    return {**spec, "version": pipeline.version}


def _write_stages(pipeline: Pipeline, spec: PipelineSpec) -> None:
    pipeline.stages.all().delete()
    Stage.objects.bulk_create(
        Stage(
            pipeline=pipeline,
            index=s["index"],
            name=s["name"],
            mode=s["mode"],
            agents=[dict(a) for a in s["agents"]],
            condition=s["condition"],
            retries=s["retries"],
            timeout_s=s["timeout_s"],
            verify=s.get("verify", STAGE_DEFAULTS["verify"]),
            verify_retries=s.get("verify_retries", STAGE_DEFAULTS["verify_retries"]),
            verdict=s.get("verdict", STAGE_DEFAULTS["verdict"]),
        )
        for s in spec["stages"]
    )


@transaction.atomic
def pipelines_save(
    *, specs: Iterable[tuple[str, PipelineSpec]], replace_default: bool = False
) -> list[LoadedPipeline]:
    """Create or update pipelines from checked specs; a changed definition bumps the version.

    A spec marked default while another pipeline is the default raises DefaultPipelineTaken
    (nothing saved) unless `replace_default`: the old default then stops being one.
    Runs already started keep their snapshot, so changing a pipeline never alters them.
    """
    items = list(specs)
    names = [spec["name"] for _, spec in items if spec["is_default"]]
    if names:
        # Locked: two loads racing to replace the default must not both pass this check.
        current = (
            Pipeline.objects.select_for_update()
            .filter(is_default=True)
            .exclude(name__in=names)
            .values_list("name", flat=True)
            .first()
        )
        if current is not None and not replace_default:
            raise DefaultPipelineTaken(new=names[0], current=current)
        # The partial unique index allows one default.
        Pipeline.objects.filter(is_default=True).exclude(name__in=names).update(is_default=False)
    loaded: list[LoadedPipeline] = []
    for source, spec in items:
        source = source[:SOURCE_MAX]
        pipeline = Pipeline.objects.select_for_update().filter(name=spec["name"]).first()
        fields = {
            "description": spec["description"],
            "match_labels": spec["match_labels"],
            "match_kinds": spec["match_kinds"],
            "is_default": spec["is_default"],
            "source": source,
        }
        if pipeline is None:
            pipeline = Pipeline.objects.create(name=spec["name"], version=1, **fields)
            _write_stages(pipeline, spec)
            change = "created"
        elif pipeline_spec(pipeline) == spec:
            change = "unchanged"
        else:
            for key, value in fields.items():
                setattr(pipeline, key, value)
            pipeline.version += 1
            pipeline.save()
            _write_stages(pipeline, spec)
            change = "updated"
        loaded.append(LoadedPipeline(spec["name"], pipeline.version, change, source))
        if change != "unchanged":
            quanta_event(
                "pipeline_created" if change == "created" else "pipeline_updated",
                {"pipeline": pipeline.name, "version": pipeline.version, "source": source},
            )
    return loaded


def pipelines_load(
    *,
    paths: Iterable[Path],
    roles: Collection[str] | None = None,
    replace_default: bool = False,
) -> list[LoadedPipeline]:
    """Read, check and save pipeline YAML: all or nothing (PipelineInvalid lists every problem;
    DefaultPipelineTaken when a file would take over the default without `replace_default`).

    `roles` are the role names an agent may use; None means ask the agent runtime.
    """
    specs = pipelines_read(paths, roles=known_roles() if roles is None else roles)
    return pipelines_save(specs=specs, replace_default=replace_default)


def pipelines_ensure_defaults() -> list[LoadedPipeline]:
    """Load the shipped pipelines when none is loaded yet (a fresh install)."""
    if Pipeline.objects.exists():
        return []
    return pipelines_load(paths=[shipped_pipelines_dir()])


def pipeline_version_bump(*, pipeline_id: int) -> None:
    """A pipeline edited in place (the admin) gets a new version; runs keep their snapshots."""
    Pipeline.objects.filter(pk=pipeline_id).update(version=F("version") + 1)


# --- reads ------------------------------------------------------------------------------------


def pipelines_list() -> QuerySet[Pipeline]:
    return Pipeline.objects.prefetch_related("stages").order_by("-is_default", "name")


def pipeline_get(*, name: str) -> Pipeline:
    try:
        return Pipeline.objects.prefetch_related("stages").get(name=name)
    except Pipeline.DoesNotExist:
        raise PipelineNotFound(f"no pipeline named {name!r}") from None


def _specificity(pipeline: Pipeline) -> tuple[int, int]:
    """More required labels beat fewer; a kind restriction beats none (then fewer kinds)."""
    kinds = len(pipeline.match_kinds)
    return (len(pipeline.match_labels), 1000 - kinds if kinds else 0)


def pipeline_choose(*, quantum: Quantum, pipelines: Sequence[Pipeline]) -> Pipeline:
    """The pipeline for a quantum among `pipelines` (no queries).

    Its override wins; otherwise the most specific pipeline whose labels the quantum all carries
    and whose kinds (if any) include its kind; ties go to the name first in alphabetical order;
    the default catches the rest.
    """
    if quantum.pipeline:
        for pipeline in pipelines:
            if pipeline.name == quantum.pipeline:
                return pipeline
        raise PipelineNotFound(
            f"quantum #{quantum.pk} asks for pipeline {quantum.pipeline!r}, which is not loaded"
        )
    labels = set(quantum.labels)
    candidates = [
        p
        for p in pipelines
        if (p.match_labels or p.match_kinds)
        and set(p.match_labels) <= labels
        and (not p.match_kinds or quantum.kind in p.match_kinds)
    ]
    if candidates:
        best = max(_specificity(p) for p in candidates)
        return min((p for p in candidates if _specificity(p) == best), key=lambda p: p.name)
    for pipeline in pipelines:
        if pipeline.is_default:
            return pipeline
    raise PipelineNotFound(
        f"no pipeline matches quantum #{quantum.pk} and no default pipeline is loaded"
    )


def pipeline_match(*, quantum: Quantum) -> Pipeline:
    return pipeline_choose(quantum=quantum, pipelines=list(pipelines_list()))
