"""What the agents learn across runs: a playbook of rules, the deltas proposed to it, skills
chosen by their record, and the reflection runs that do the learning."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from bursts.models import AgentRun, Burst, Wave


class RuleScope(models.TextChoices):
    PROJECT = "project", "project (this target repository)"
    GLOBAL = "global", "global (every project)"


class RuleKind(models.TextChoices):
    RULE = "rule", "rule (do this)"
    ANTI_PATTERN = "anti_pattern", "anti-pattern (avoid this)"


class RuleMaturity(models.TextChoices):
    """How far a rule's record carries it (moved by feedback, see reflection.services.playbook).

    candidate   -> established (helpful and confident enough) | deprecated
    established -> proven | deprecated
    proven      -> deprecated
    deprecated  -> (terminal: a deprecated rule is only replaced, through a new delta)
    """

    CANDIDATE = "candidate", "candidate"
    ESTABLISHED = "established", "established"
    PROVEN = "proven", "proven"
    DEPRECATED = "deprecated", "deprecated"


class PlaybookRule(models.Model):
    """One line of the playbook, injected into the prompts of the agents its tags match."""

    scope = models.CharField(max_length=16, choices=RuleScope.choices, default=RuleScope.PROJECT)
    text = models.TextField()
    kind = models.CharField(max_length=16, choices=RuleKind.choices, default=RuleKind.RULE)
    roles = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    labels = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    paths = ArrayField(models.CharField(max_length=500), default=list, blank=True)
    confidence = models.FloatField(default=0.5)
    helpful = models.PositiveIntegerField(default=0)
    harmful = models.PositiveIntegerField(default=0)
    maturity = models.CharField(
        max_length=16, choices=RuleMaturity.choices, default=RuleMaturity.CANDIDATE
    )
    last_feedback_at = models.DateTimeField(null=True, blank=True)
    # When `confidence` was last brought up to date (feedback or the decay sweep): decay runs
    # from here, so a daily sweep never decays the same interval twice.
    confidence_at = models.DateTimeField(default=timezone.now)
    evidence_event_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    evidence_agent_run_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The text's English lexemes, kept by Postgres: injection matches and ranks rules on it.
    search = models.GeneratedField(
        expression=SearchVector("text", config="english"),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(text=""), name="playbookrule_text_not_empty"),
            models.CheckConstraint(
                condition=Q(confidence__gte=0) & Q(confidence__lte=1),
                name="playbookrule_confidence_range",
            ),
            models.CheckConstraint(
                condition=Q(scope__in=RuleScope.values), name="playbookrule_scope_valid"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=RuleKind.values), name="playbookrule_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(maturity__in=RuleMaturity.values), name="playbookrule_maturity_valid"
            ),
        ]
        indexes = [
            # Injection: the rules whose roles / labels overlap the agent's (`roles && ARRAY[..]`).
            GinIndex(fields=["roles"], name="playbookrule_roles"),
            GinIndex(fields=["labels"], name="playbookrule_labels"),
            # Injection: the rules whose text matches the agent's quantum (`search @@ query`).
            GinIndex(fields=["search"], name="playbookrule_search"),
            # Injection when most rules match: the most confident matching rules, walked in order.
            models.Index(fields=["-confidence", "id"], name="playbookrule_confidence"),
            # Injection and the playbook page: the live rules by maturity, most confident first.
            models.Index(fields=["maturity", "-confidence"], name="playbookrule_maturity"),
        ]

    def __str__(self) -> str:
        return f"rule {self.pk} [{self.maturity}] {self.text[:60]}"


class DeltaOp(models.TextChoices):
    ADD = "add", "add a rule"
    UPDATE = "update", "update a rule"
    DEPRECATE = "deprecate", "deprecate a rule"


class DeltaStatus(models.TextChoices):
    """Where a proposed change of the playbook stands (transitions: `DELTA_TRANSITIONS`).

    proposed -> accepted (by the curator: applied to the playbook; project scope only) |
                grounded (confirmed by the operator: applied) | rejected (with the reason)
    accepted, grounded, rejected: terminal
    """

    PROPOSED = "proposed", "proposed"
    ACCEPTED = "accepted", "accepted"
    REJECTED = "rejected", "rejected"
    GROUNDED = "grounded", "grounded"


DELTA_TRANSITIONS: dict[str, frozenset[str]] = {
    DeltaStatus.PROPOSED: frozenset(
        {DeltaStatus.ACCEPTED, DeltaStatus.REJECTED, DeltaStatus.GROUNDED}
    ),
    DeltaStatus.ACCEPTED: frozenset(),
    DeltaStatus.REJECTED: frozenset(),
    DeltaStatus.GROUNDED: frozenset(),
}


class ReflectionRunStatus(models.TextChoices):
    """Where one reflection over a burst stands (transitions: `REFLECTION_RUN_TRANSITIONS`).

    started    -> extracting | cached (the burst was reflected on already) | error
    extracting -> proposing | error
    proposing  -> evaluating | error
    evaluating -> curating | error
    curating   -> completed | error
    completed, cached: terminal; error -> started (tried again)
    """

    STARTED = "started", "started"
    EXTRACTING = "extracting", "extracting"
    PROPOSING = "proposing", "proposing"
    EVALUATING = "evaluating", "evaluating"
    CURATING = "curating", "curating"
    COMPLETED = "completed", "completed"
    CACHED = "cached", "cached"
    ERROR = "error", "error"


S = ReflectionRunStatus
REFLECTION_RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    S.STARTED: frozenset({S.EXTRACTING, S.CACHED, S.ERROR}),
    S.EXTRACTING: frozenset({S.PROPOSING, S.ERROR}),
    S.PROPOSING: frozenset({S.EVALUATING, S.ERROR}),
    S.EVALUATING: frozenset({S.CURATING, S.ERROR}),
    S.CURATING: frozenset({S.COMPLETED, S.ERROR}),
    S.COMPLETED: frozenset(),
    S.CACHED: frozenset(),
    S.ERROR: frozenset({S.STARTED}),
}
REFLECTION_RUN_TERMINAL: frozenset[str] = frozenset({S.COMPLETED, S.CACHED})
del S


class ReflectionRun(models.Model):
    """One reflection over a finished burst: its stage, timings and counts."""

    burst = models.OneToOneField(
        Burst, null=True, blank=True, on_delete=models.SET_NULL, related_name="reflection"
    )
    wave = models.ForeignKey(
        Wave, null=True, blank=True, on_delete=models.SET_NULL, related_name="reflections"
    )
    status = models.CharField(
        max_length=16, choices=ReflectionRunStatus.choices, default=ReflectionRunStatus.STARTED
    )
    timings = models.JSONField(default=dict, blank=True, help_text="seconds per stage")
    counts = models.JSONField(default=dict, blank=True, help_text="items per stage")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ReflectionRunStatus.values),
                name="reflectionrun_status_valid",
            ),
        ]
        indexes = [
            # The reflection page and the sweep of stuck runs: runs by status, newest first.
            models.Index(fields=["status", "-created_at"], name="reflectionrun_status_time"),
        ]

    def __str__(self) -> str:
        return f"reflection {self.pk} [{self.status}] burst {self.burst_id}"


class PlaybookDelta(models.Model):
    """One proposed change of the playbook, decided by the curator or the operator."""

    op = models.CharField(max_length=16, choices=DeltaOp.choices)
    rule = models.ForeignKey(
        PlaybookRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="deltas"
    )
    # The scope of the rule it adds or updates: a global one always waits for the operator.
    scope = models.CharField(max_length=16, choices=RuleScope.choices, default=RuleScope.PROJECT)
    text = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=RuleKind.choices, default=RuleKind.RULE)
    roles = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    labels = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    paths = ArrayField(models.CharField(max_length=500), default=list, blank=True)
    evidence_event_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    evidence_agent_run_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    status = models.CharField(
        max_length=16, choices=DeltaStatus.choices, default=DeltaStatus.PROPOSED
    )
    reason = models.TextField(blank=True)
    reflection_run = models.ForeignKey(
        ReflectionRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="deltas"
    )
    decided_by = models.CharField(max_length=200, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(op__in=DeltaOp.values), name="playbookdelta_op"),
            models.CheckConstraint(
                condition=Q(status__in=DeltaStatus.values), name="playbookdelta_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=RuleKind.values), name="playbookdelta_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(scope__in=RuleScope.values), name="playbookdelta_scope_valid"
            ),
            # An add names no rule and brings its text; an update or deprecation names its rule.
            models.CheckConstraint(
                condition=(Q(op=DeltaOp.ADD) & ~Q(text=""))
                | (~Q(op=DeltaOp.ADD) & Q(rule__isnull=False))
                | ~Q(status=DeltaStatus.PROPOSED),
                name="playbookdelta_op_shape",
            ),
        ]
        indexes = [
            # The curator and the review page: the deltas waiting, oldest first.
            models.Index(fields=["status", "created_at"], name="playbookdelta_status_time"),
        ]

    def __str__(self) -> str:
        return f"delta {self.pk} {self.op} [{self.status}]"


class Skill(models.Model):
    """A reusable prompt template, chosen among the matching ones by its Beta(alpha, beta)
    record of successes and failures."""

    name = models.CharField(max_length=200, unique=True)
    roles = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    labels = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    template = models.TextField()
    alpha = models.FloatField(default=1.0, help_text="1 + successes")
    beta = models.FloatField(default=1.0, help_text="1 + failures")
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="skill_name_not_empty"),
            models.CheckConstraint(
                condition=Q(alpha__gt=0) & Q(beta__gt=0), name="skill_beta_positive"
            ),
        ]
        indexes = [
            # Selection: the skills whose roles / labels overlap the agent's.
            GinIndex(fields=["roles"], name="skill_roles"),
            GinIndex(fields=["labels"], name="skill_labels"),
        ]

    def __str__(self) -> str:
        return f"skill {self.name}"


class SkillOutcome(models.TextChoices):
    """A use's outcome: pending -> success | failure (once; both terminal)."""

    PENDING = "pending", "pending"
    SUCCESS = "success", "success"
    FAILURE = "failure", "failure"


class SkillUse(models.Model):
    """One agent run that used a skill; its outcome updates the skill's record once."""

    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="skill_uses")
    agent_run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="skill_uses")
    outcome = models.CharField(
        max_length=16, choices=SkillOutcome.choices, default=SkillOutcome.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["skill", "agent_run"], name="skilluse_once_per_run"),
            models.CheckConstraint(
                condition=Q(outcome__in=SkillOutcome.values), name="skilluse_outcome_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.skill_id} in run {self.agent_run_id}: {self.outcome}"


class RuleUse(models.Model):
    """One rule injected into one agent run's prompt, at its rank; the run's outcome counts once
    for the rule (pending -> success | failure, see reflection.services.injection)."""

    rule = models.ForeignKey(PlaybookRule, on_delete=models.CASCADE, related_name="uses")
    agent_run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="rule_uses")
    rank = models.PositiveSmallIntegerField(help_text="1 = the first rule of the prompt")
    outcome = models.CharField(
        max_length=16, choices=SkillOutcome.choices, default=SkillOutcome.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rule", "agent_run"], name="ruleuse_once_per_run"),
            models.CheckConstraint(
                condition=Q(outcome__in=SkillOutcome.values), name="ruleuse_outcome_valid"
            ),
        ]
        indexes = [
            # Attribution and the Focus page: an agent run's injected rules.
            models.Index(fields=["agent_run", "rank"], name="ruleuse_run_rank"),
        ]

    def __str__(self) -> str:
        return f"rule {self.rule_id} in run {self.agent_run_id}: {self.outcome}"


class ConfidenceCause(models.TextChoices):
    CREATED = "created", "created (the starting confidence)"
    SUCCESS = "success", "a helpful feedback"
    FAILURE = "failure", "a harmful feedback"


class RuleConfidencePoint(models.Model):
    """A rule's confidence as one write set it: at its creation and after each feedback.

    The daily decay sweep writes no point: between two points, and from the last one to now,
    confidence follows the half-life from the earlier point (see reflection.selectors).
    """

    rule = models.ForeignKey(
        PlaybookRule, on_delete=models.CASCADE, related_name="confidence_points"
    )
    confidence = models.FloatField()
    at = models.DateTimeField()
    cause = models.CharField(max_length=16, choices=ConfidenceCause.choices)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(confidence__gte=0) & Q(confidence__lte=1),
                name="ruleconfidencepoint_range",
            ),
            models.CheckConstraint(
                condition=Q(cause__in=ConfidenceCause.values),
                name="ruleconfidencepoint_cause_valid",
            ),
        ]
        indexes = [
            # The Playbook page's sparklines: each shown rule's latest points, newest first.
            models.Index(fields=["rule", "-at"], name="ruleconfidencepoint_rule_at"),
        ]

    def __str__(self) -> str:
        return f"rule {self.rule_id} at {self.at:%Y-%m-%d %H:%M}: {self.confidence:.3f}"
