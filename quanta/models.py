"""Quanta: the units of work, their dependencies and comments."""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import F, Q

from repos.services import default_repository_id


class QuantumStatus(models.TextChoices):
    """Where a quantum stands.

    Transitions (each a compare-and-set in `quanta.services`):
      open        -> in_progress (claimed by the burst manager) | deferred | blocked | closed
      in_progress -> open (its run failed or was cancelled) | blocked (quarantine) | closed
      blocked     -> open | deferred | closed
      deferred    -> open | closed
      closed      -> open (reopen)
    """

    OPEN = "open", "open"
    IN_PROGRESS = "in_progress", "in progress"
    BLOCKED = "blocked", "blocked"
    DEFERRED = "deferred", "deferred"
    CLOSED = "closed", "closed"


TERMINAL: frozenset[str] = frozenset({QuantumStatus.CLOSED})


class QuantumKind(models.TextChoices):
    TASK = "task", "task"
    BUG = "bug", "bug"
    FEATURE = "feature", "feature"
    EPIC = "epic", "epic"
    CHORE = "chore", "chore"
    CORRECTION = "correction", "correction (files a fix for a rejected assumption)"


class Complexity(models.TextChoices):
    """Drives model routing: trivial may run without an LLM, complex gets the strongest model."""

    TRIVIAL = "trivial", "trivial"
    STANDARD = "standard", "standard"
    COMPLEX = "complex", "complex"


PRIORITY_MIN, PRIORITY_MAX = 0, 4  # 0 = critical


class Quantum(models.Model):
    title = models.CharField(max_length=500)
    # The repository the quantum's work is in; made without one: the default repository.
    repository = models.ForeignKey(
        "repos.Repository",
        on_delete=models.PROTECT,
        related_name="quanta",
        default=default_repository_id,
    )
    body = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=QuantumKind.choices, default=QuantumKind.TASK)
    status = models.CharField(
        max_length=16, choices=QuantumStatus.choices, default=QuantumStatus.OPEN
    )
    priority = models.PositiveSmallIntegerField(default=2, help_text="0 = critical .. 4 = backlog")
    labels = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    pipeline = models.CharField(
        max_length=100, blank=True, help_text="pipeline override by name; blank = matched"
    )
    acceptance = models.TextField(blank=True, help_text="acceptance criteria")
    verify_commands = ArrayField(models.TextField(), default=list, blank=True)
    complexity = models.CharField(
        max_length=16, choices=Complexity.choices, default=Complexity.STANDARD
    )
    # Set by the classifier (quanta.complexity), not by the operator: editing the title or body
    # classifies it again; an operator's value is kept.
    complexity_auto = models.BooleanField(
        default=False, db_default=False, help_text="set by the classifier"
    )
    close_reason = models.TextField(blank=True)
    # The stable key of an imported quantum (its record's `key`, else its `ref`, else its
    # title): importing the same record again updates this quantum instead of adding another.
    # Blank: not imported.
    import_key = models.CharField(max_length=600, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    # How many `blocks` dependencies are not closed. Maintained by database triggers
    # (migration 0003) on every path that can change it, so the ready query is a plain
    # partial-index scan instead of an anti-join over the dependency graph.
    open_blockers = models.PositiveIntegerField(default=0, editable=False)
    # Title (A), body (B) and comments (C); kept current by quanta.services.search_refresh.
    search_vector = SearchVectorField(null=True, editable=False)

    class Meta:
        verbose_name_plural = "quanta"
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="quantum_priority_range",
            ),
            models.CheckConstraint(condition=~Q(title=""), name="quantum_title_not_empty"),
            models.CheckConstraint(
                condition=Q(status__in=QuantumStatus.values), name="quantum_status_valid"
            ),
            models.UniqueConstraint(
                fields=["import_key"], condition=~Q(import_key=""), name="quantum_import_key"
            ),
        ]
        indexes = [
            # quanta_ready(): ready quanta in priority-then-age order. Partial, so it holds only
            # the ready set however large the backlog, and the planner walks it in order.
            models.Index(
                fields=["priority", "created_at", "id"],
                condition=Q(status="open", open_blockers=0),
                name="quantum_ready_order",
            ),
            # quanta_ready(repository_id=...): a wave's ready quanta, the same walk within one
            # repository.
            models.Index(
                fields=["repository", "priority", "created_at", "id"],
                condition=Q(status="open", open_blockers=0),
                name="quantum_ready_repository",
            ),
            # quanta_list() in its order, unfiltered or filtered (the API's keyset pages: a walk
            # from the cursor, never a sort of the whole table).
            models.Index(fields=["priority", "created_at", "id"], name="quantum_list_order"),
            # quanta_list(status=...) and the dashboard's counts per status.
            models.Index(fields=["status", "priority"], name="quantum_status_priority"),
            # quanta_list(label=...) and wave scope by labels: labels @> ARRAY[...].
            GinIndex(fields=["labels"], name="quantum_labels"),
            # quanta_search(): title/body/comments full-text.
            GinIndex(fields=["search_vector"], name="quantum_search"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"


class DependencyKind(models.TextChoices):
    """Only BLOCKS gates readiness; the others are for humans and reflection."""

    BLOCKS = "blocks", "blocks"
    PARENT_CHILD = "parent-child", "parent-child"
    RELATED = "related", "related"
    DISCOVERED_FROM = "discovered-from", "discovered from"


class Dependency(models.Model):
    """`quantum` depends on `depends_on` (for BLOCKS: cannot start until it is closed)."""

    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="dependencies")
    depends_on = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="dependents")
    kind = models.CharField(
        max_length=16, choices=DependencyKind.choices, default=DependencyKind.BLOCKS
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "dependencies"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=~Q(quantum=F("depends_on")), name="dependency_no_self"
            ),
            # Its index also serves the ready query's anti-join (quantum_id = q.id AND kind = ...).
            models.UniqueConstraint(
                fields=["quantum", "kind", "depends_on"], name="dependency_unique_edge"
            ),
        ]
        indexes = [
            # What closing a quantum unblocks, and the cycle walk: edges by their target.
            models.Index(fields=["depends_on", "kind"], name="dependency_target"),
        ]

    def __str__(self) -> str:
        return f"#{self.quantum_id} {self.kind} #{self.depends_on_id}"


class AuthorKind(models.TextChoices):
    OPERATOR = "operator", "operator"
    PSYCHONAUT = "psychonaut", "psychonaut"
    SYSTEM = "system", "system"


class Comment(models.Model):
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="comments")
    author_kind = models.CharField(
        max_length=16, choices=AuthorKind.choices, default=AuthorKind.OPERATOR
    )
    author = models.CharField(max_length=200, help_text="username, agent id or subsystem")
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=~Q(body=""), name="comment_not_empty")]
        indexes = [
            # A quantum's comments in order (detail page, search refresh).
            models.Index(fields=["quantum", "created_at"], name="comment_quantum_time"),
        ]

    def __str__(self) -> str:
        return f"comment on #{self.quantum_id} by {self.author}"


from quanta.pipeline_models import Pipeline, Stage, StageMode  # noqa: E402, F401
