"""Grounding of pipeline mutations: a psychonaut proposes, the operator approves (a new pipeline
version) or rejects; a proposal nobody answers times out into a pipeline drift."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.events import publish
from core.redaction import redact
from quanta.pipeline_models import Pipeline
from quanta.pipelines.loader import pipelines_parse
from quanta.pipelines.services import known_roles, pipelines_save
from quanta.pipelines.spec import PipelineSpec
from tether.errors import AlreadyDecided, InvalidProposal, NotFound
from tether.events import QUESTIONS_TOPIC, MutationPayload, TetherEventType
from tether.models import MutationStatus, PipelineMutation
from tether.services.drifts import drift_open_for_mutation

logger = logging.getLogger(__name__)

EXPIRE_TASK = "tether.mutation_expire"


def proposal_check(*, pipeline: str, text: str) -> PipelineSpec:
    """Parse the proposed YAML with the pipelines loader: exactly one pipeline, named as said."""
    specs, problems = pipelines_parse(text, source="proposal", roles=known_roles())
    if problems:
        raise InvalidProposal("the proposed pipeline is invalid:\n" + "\n".join(problems))
    if len(specs) != 1:
        raise InvalidProposal(f"propose exactly one pipeline (found {len(specs)})")
    spec = specs[0][1]
    if spec["name"] != pipeline:
        raise InvalidProposal(
            f"the YAML defines pipeline {spec['name']!r}, not {pipeline!r} as proposed"
        )
    if spec["is_default"]:
        current = (
            Pipeline.objects.filter(is_default=True)
            .exclude(name=pipeline)
            .values_list("name", flat=True)
            .first()
        )
        if current is not None:
            # Approving would silently demote the current default: only the operator changes
            # which pipeline is the default (`pipelines load --replace-default`).
            raise InvalidProposal(
                f"default: the proposal would make {pipeline!r} the default pipeline in place "
                f"of {current!r}; propose it without `default: true`"
            )
    return spec


def mutation_payload(m: PipelineMutation) -> MutationPayload:
    return {
        "mutation_id": m.pk,
        "pipeline": m.pipeline_name,
        "base_version": m.base_version,
        "status": m.status,
        "agent_run_id": m.agent_run_id,
        "quantum_id": m.quantum_id,
        "rationale": m.rationale,
        "deadline": m.deadline.isoformat(),
        "resulting_version": m.resulting_version,
    }


@transaction.atomic
def mutation_propose(
    *,
    pipeline: str,
    text: str,
    rationale: str,
    agent_run_id: int | None = None,
    quantum_id: int | None = None,
    tool_use_id: str = "",
) -> PipelineMutation:
    """Store a checked proposal (InvalidProposal stores nothing). Once per tool call."""
    if agent_run_id is not None and tool_use_id:
        existing = PipelineMutation.objects.filter(
            agent_run_id=agent_run_id, tool_use_id=tool_use_id
        ).first()
        if existing is not None:
            return existing
    proposal_check(pipeline=pipeline, text=text)
    current = Pipeline.objects.filter(name=pipeline).values_list("version", flat=True).first()
    timeout = settings.TETHER_MUTATION_TIMEOUT_S
    mutation = PipelineMutation.objects.create(
        pipeline_name=pipeline,
        base_version=current or 0,
        # What an agent wrote is stored redacted, like all its text.
        proposed_yaml=redact(text),
        rationale=redact(rationale.strip()),
        agent_run_id=agent_run_id,
        quantum_id=quantum_id,
        tool_use_id=tool_use_id,
        deadline=timezone.now() + timedelta(seconds=timeout),
    )
    publish(
        QUESTIONS_TOPIC, TetherEventType.PIPELINE_MUTATION_SUBMITTED, mutation_payload(mutation)
    )
    mutation_id = mutation.pk

    def timer() -> None:
        from core.celery import app

        try:  # the beat sweep expires it anyway if this message is lost
            app.send_task(EXPIRE_TASK, args=(mutation_id,), countdown=timeout)
        except Exception:
            logger.warning("tether: could not schedule the timeout of mutation %s", mutation_id)

    transaction.on_commit(timer)
    return mutation


def _decide(
    mutation_id: int, to: str, by: str, comment: str = "", **fields: object
) -> PipelineMutation:
    updated = PipelineMutation.objects.filter(pk=mutation_id, status=MutationStatus.PENDING).update(
        status=to, decided_by=by, decided_at=timezone.now(), comment=comment, **fields
    )
    mutation = PipelineMutation.objects.filter(pk=mutation_id).first()
    if mutation is None:
        raise NotFound(f"no pipeline mutation #{mutation_id}")
    if updated != 1:
        raise AlreadyDecided(f"mutation #{mutation_id} is {mutation.status}; nothing changed")
    publish(
        QUESTIONS_TOPIC, TetherEventType.PIPELINE_MUTATION_RESPONDED, mutation_payload(mutation)
    )
    return mutation


@transaction.atomic
def mutation_approve(*, mutation_id: int, by: str = "operator") -> PipelineMutation:
    """Save the proposal as the pipeline's next version. Refused when the pipeline changed since
    the proposal (approving would silently undo that change) or no longer checks."""
    mutation = PipelineMutation.objects.select_for_update().filter(pk=mutation_id).first()
    if mutation is None:
        raise NotFound(f"no pipeline mutation #{mutation_id}")
    if mutation.status != MutationStatus.PENDING:
        raise AlreadyDecided(f"mutation #{mutation_id} is {mutation.status}; nothing changed")
    current = (
        Pipeline.objects.filter(name=mutation.pipeline_name)
        .values_list("version", flat=True)
        .first()
    ) or 0
    if current != mutation.base_version:
        raise InvalidProposal(
            f"pipeline {mutation.pipeline_name!r} is at version {current} now; the proposal was "
            f"made against version {mutation.base_version}. Reject it and ask for a new one."
        )
    spec = proposal_check(pipeline=mutation.pipeline_name, text=mutation.proposed_yaml)
    (loaded,) = pipelines_save(specs=[(f"tether mutation #{mutation.pk}", spec)])
    return _decide(mutation_id, MutationStatus.APPROVED, by, resulting_version=loaded.version)


@transaction.atomic
def mutation_reject(
    *, mutation_id: int, by: str = "operator", reason: str = ""
) -> PipelineMutation:
    return _decide(mutation_id, MutationStatus.REJECTED, by, reason.strip())


@transaction.atomic
def mutation_expire(*, mutation_id: int, now: datetime | None = None) -> bool:
    """Past its deadline: timed out, the old version stays, a pipeline drift is recorded."""
    now = now or timezone.now()
    if (
        PipelineMutation.objects.filter(
            pk=mutation_id, status=MutationStatus.PENDING, deadline__lte=now
        ).update(status=MutationStatus.TIMED_OUT, decided_by="timeout", decided_at=now)
        != 1
    ):
        return False
    mutation = PipelineMutation.objects.get(pk=mutation_id)
    publish(
        QUESTIONS_TOPIC, TetherEventType.PIPELINE_MUTATION_RESPONDED, mutation_payload(mutation)
    )
    if mutation.quantum_id is None:
        return True
    drift_open_for_mutation(mutation=mutation)
    return True


def mutations_expire_due() -> list[int]:
    now = timezone.now()
    due = list(
        PipelineMutation.objects.filter(status=MutationStatus.PENDING, deadline__lte=now)
        .order_by("deadline")
        .values_list("pk", flat=True)[:500]
    )
    return [pk for pk in due if mutation_expire(mutation_id=pk, now=now)]
