"""The autopilot: goals decomposed into quanta, the hub's state machine, its spend and what it
found in the target repository.

Goals and the hub change state only through guarded transitions in `autopilot.services`
(`goals`, `hub`); every transition is a history row with its reason.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from bursts.models import AgentRun
from quanta.models import PRIORITY_MAX, PRIORITY_MIN, Quantum
from repos.services import default_repository_id


class GoalStatus(models.TextChoices):
    """Where a goal stands (transitions: `GOAL_TRANSITIONS`).

    proposed    -> approved (the Tether accepts it) | abandoned
    approved    -> decomposing (a planner agent runs) | abandoned
    decomposing -> active (its quanta are filed) | failed (no valid plan after the tries) |
                   abandoned
    active      -> verifying (every quantum closed, every change merged) | failed | abandoned
    verifying   -> done (the goal's verify commands pass on the integration branch) |
                   active (a quantum reopened) | failed | abandoned
    failed      -> approved (approved again: decomposed anew) | abandoned
    """

    PROPOSED = "proposed", "proposed"
    APPROVED = "approved", "approved"
    DECOMPOSING = "decomposing", "decomposing"
    ACTIVE = "active", "active"
    VERIFYING = "verifying", "verifying"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    ABANDONED = "abandoned", "abandoned"


GOAL_TRANSITIONS: dict[str, frozenset[str]] = {
    GoalStatus.PROPOSED: frozenset({GoalStatus.APPROVED, GoalStatus.ABANDONED}),
    GoalStatus.APPROVED: frozenset({GoalStatus.DECOMPOSING, GoalStatus.ABANDONED}),
    GoalStatus.DECOMPOSING: frozenset({GoalStatus.ACTIVE, GoalStatus.FAILED, GoalStatus.ABANDONED}),
    GoalStatus.ACTIVE: frozenset({GoalStatus.VERIFYING, GoalStatus.FAILED, GoalStatus.ABANDONED}),
    GoalStatus.VERIFYING: frozenset(
        {GoalStatus.DONE, GoalStatus.ACTIVE, GoalStatus.FAILED, GoalStatus.ABANDONED}
    ),
    GoalStatus.FAILED: frozenset({GoalStatus.APPROVED, GoalStatus.ABANDONED}),
    GoalStatus.DONE: frozenset(),
    GoalStatus.ABANDONED: frozenset(),
}
GOAL_OPEN: frozenset[str] = frozenset(
    {GoalStatus.APPROVED, GoalStatus.DECOMPOSING, GoalStatus.ACTIVE, GoalStatus.VERIFYING}
)


class GoalSource(models.TextChoices):
    OPERATOR = "operator", "operator"
    CONTEMPLATION = "contemplation", "contemplation"
    WEBHOOK = "webhook", "webhook"


class Goal(models.Model):
    title = models.CharField(max_length=500)
    # The repository the goal's quanta are made in; made without one: the default repository.
    repository = models.ForeignKey(
        "repos.Repository",
        on_delete=models.PROTECT,
        related_name="goals",
        default=default_repository_id,
    )
    description = models.TextField(blank=True)
    success_criteria = models.TextField(help_text="what must be true when the goal is done")
    verify_commands = ArrayField(
        models.TextField(), default=list, blank=True,
        help_text="run on the integration branch once every quantum of the goal is merged",
    )  # fmt: skip
    priority = models.PositiveSmallIntegerField(default=2, help_text="0 = critical .. 4 = backlog")
    labels = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    budget_usd = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True,
        help_text="what the goal's agents may spend in all; blank = no limit of its own",
    )  # fmt: skip
    source = models.CharField(
        max_length=16, choices=GoalSource.choices, default=GoalSource.OPERATOR
    )
    status = models.CharField(
        max_length=16, choices=GoalStatus.choices, default=GoalStatus.PROPOSED
    )
    reason = models.TextField(blank=True, help_text="why it is in its status (failures: the cause)")
    # The goal's anchor quantum (an epic, deferred: never run by a wave): the planner agent runs
    # on it, and the goal's quanta are its children.
    epic = models.OneToOneField(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="goal"
    )
    plan_tries = models.PositiveSmallIntegerField(default=0)
    created_by = models.CharField(max_length=200, blank=True)
    approved_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="goal_priority_range",
            ),
            models.CheckConstraint(condition=~Q(title=""), name="goal_title_not_empty"),
            models.CheckConstraint(
                condition=Q(status__in=GoalStatus.values), name="goal_status_valid"
            ),
        ]
        indexes = [
            # The hub's snapshot and the Goals page: goals by status in priority-then-age order.
            models.Index(fields=["status", "priority", "created_at"], name="goal_status_order"),
        ]

    def __str__(self) -> str:
        return f"goal {self.pk} {self.title}"


class GoalTransition(models.Model):
    """One status change of a goal, with its reason: the goal's history."""

    goal = models.ForeignKey(Goal, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    by = models.CharField(max_length=200, blank=True, help_text="operator, agent id or subsystem")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["goal", "created_at"], name="goaltransition_goal_time")]

    def __str__(self) -> str:
        return f"goal {self.goal_id}: {self.from_status or '-'} -> {self.to_status}"


class HubState(models.TextChoices):
    EXECUTING = "executing", "executing"
    IMPROVING = "improving", "improving"
    CONTEMPLATING = "contemplating", "contemplating"
    RESTING = "resting", "resting"
    HEALING = "healing", "healing"


# What spend is counted under: the hub state that caused the work, or the operator's own work.
OPERATOR_SCOPE = "operator"
SPEND_SCOPES: tuple[str, ...] = (*HubState.values, OPERATOR_SCOPE)


class Hub(models.Model):
    """The autopilot's one row (pk 1): its state, why, and the operator's hold on it.

    A fresh installation starts paused: the autopilot acts on its own only once the operator
    resumes it.
    """

    state = models.CharField(max_length=16, choices=HubState.choices, default=HubState.RESTING)
    reason = models.TextField(blank=True)
    since = models.DateTimeField(auto_now_add=True)
    paused = models.BooleanField(default=True)
    paused_reason = models.TextField(blank=True, default="not started: resume to start it")
    forced = models.BooleanField(
        default=False, help_text="the operator forced the state: ticks keep it until resumed"
    )
    tick_at = models.DateTimeField(null=True, blank=True)
    scanned_at = models.DateTimeField(null=True, blank=True)
    contemplated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="hub_single_row"),
            models.CheckConstraint(condition=Q(state__in=HubState.values), name="hub_state_valid"),
        ]

    def __str__(self) -> str:
        return f"autopilot {self.state}{' (paused)' if self.paused else ''}"


class HubTransition(models.Model):
    """One change of the hub's state (or of its pause), with the reason and the snapshot that
    decided it: the autopilot's history."""

    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.TextField()
    by = models.CharField(max_length=200, help_text="`tick` or the operator")
    snapshot = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["created_at"], name="hubtransition_time")]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state}: {self.reason}"


class Spend(models.Model):
    """What model calls cost, per day, per scope (hub state or operator) and per goal."""

    day = models.DateField()
    scope = models.CharField(max_length=16)
    goal = models.ForeignKey(Goal, null=True, blank=True, on_delete=models.CASCADE)
    usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    calls = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "scope", "goal"], name="spend_once_per_day_scope_goal",
                nulls_distinct=False,
            ),
            models.CheckConstraint(condition=Q(scope__in=SPEND_SCOPES), name="spend_scope_valid"),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.day} {self.scope}: ${self.usd}"


class Hold(models.Model):
    """An agent run paused by a budget before a model call (waiting, holding no worker); the
    tick resumes it when the budget allows again."""

    agent_run = models.OneToOneField(AgentRun, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=32, help_text="`cap`, a hub state, or `goal:<id>`")
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"hold on agent run {self.agent_run_id} ({self.scope})"


class Finding(models.Model):
    """What a scanner found in the target repository, remembered so that the same finding on the
    same file is not filed again within the window."""

    scanner = models.CharField(max_length=32)
    path = models.TextField()
    line = models.PositiveIntegerField(default=0)
    rule = models.CharField(max_length=200, blank=True)
    message = models.TextField()
    fingerprint = models.CharField(max_length=64, unique=True)
    quantum = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    skipped = models.TextField(blank=True, help_text="why it was not filed (last time)")
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField()
    filed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.scanner} {self.path}:{self.line} {self.rule}"


class BaseCheck(models.Model):
    """A repository's integration branch's checks at one commit (healing files a quantum in that
    repository after repeated failures of its own checks)."""

    # Made without one: the default repository.
    repository = models.ForeignKey(
        "repos.Repository",
        on_delete=models.PROTECT,
        related_name="base_checks",
        default=default_repository_id,
    )
    sha = models.CharField(max_length=64)
    ok = models.BooleanField()
    summary = models.TextField(blank=True)
    quantum = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the healing quantum filed for it",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The hub's snapshot: each repository's latest checks, newest first.
            models.Index(fields=["repository", "created_at"], name="basecheck_repository_time"),
        ]

    def __str__(self) -> str:
        return f"{self.sha[:10]} {'ok' if self.ok else 'failing'}"
