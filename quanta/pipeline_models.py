"""Pipelines: named ordered stages of psychonauts, matched to quanta by labels and kinds.

Imported at the bottom of quanta/models.py so Django finds the models in the quanta app.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class StageMode(models.TextChoices):
    """sequential: one agent after the other, each sees the prior output (a Celery chain).
    fan_out: all agents at once on the same context (a Celery chord)."""

    SEQUENTIAL = "sequential", "sequential"
    FAN_OUT = "fan_out", "fan-out"


class VerdictPolicy(models.TextChoices):
    """What a negative verdict of one of the stage's agents does. block: the stage fails (and
    is retried like any failure); comment: the verdict is recorded on the quantum and the run
    goes on."""

    BLOCK = "block", "block"
    COMMENT = "comment", "comment"


VERIFY_RETRIES_MAX = 5


class Pipeline(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    match_labels = ArrayField(
        models.CharField(max_length=64),
        default=list,
        blank=True,
        help_text="a quantum matches when it carries all of these",
    )
    match_kinds = ArrayField(
        models.CharField(max_length=16),
        default=list,
        blank=True,
        help_text="a quantum matches when its kind is one of these (empty = any kind)",
    )
    is_default = models.BooleanField(default=False, help_text="catches quanta nothing else matches")
    version = models.PositiveIntegerField(default=1, help_text="bumped when the definition changes")
    source = models.CharField(max_length=500, blank=True, help_text="file it was loaded from")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # At most one default pipeline.
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="pipeline_one_default"
            ),
            models.CheckConstraint(condition=~Q(name=""), name="pipeline_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class Stage(models.Model):
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="stages")
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    mode = models.CharField(max_length=16, choices=StageMode.choices, default=StageMode.SEQUENTIAL)
    # [{"role": "coder", "settings": {"model": ...}}, ...] in order.
    agents = models.JSONField(default=list)
    condition = models.CharField(
        max_length=500, blank=True, help_text="skip the stage when false; blank = always"
    )
    retries = models.PositiveSmallIntegerField(default=0, help_text="extra attempts per agent")
    timeout_s = models.PositiveIntegerField(default=0, help_text="per agent; 0 = no limit")
    verify = models.BooleanField(
        default=False, help_text="run the quantum's verify commands after the stage's agents"
    )
    verify_retries = models.PositiveSmallIntegerField(
        default=2, help_text=f"attempts to fix failed checks (0..{VERIFY_RETRIES_MAX})"
    )
    verdict = models.CharField(
        max_length=16,
        choices=VerdictPolicy.choices,
        default=VerdictPolicy.BLOCK,
        help_text="what a negative verdict does: block the stage, or only comment",
    )

    class Meta:
        ordering = ["pipeline", "index"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "index"], name="stage_index_unique"),
            models.UniqueConstraint(fields=["pipeline", "name"], name="stage_name_unique"),
            models.CheckConstraint(condition=Q(mode__in=StageMode.values), name="stage_mode_valid"),
            models.CheckConstraint(
                condition=Q(verdict__in=VerdictPolicy.values), name="stage_verdict_valid"
            ),
            models.CheckConstraint(
                condition=Q(verify_retries__lte=VERIFY_RETRIES_MAX),
                name="stage_verify_retries_max",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id}:{self.index} {self.name}"
