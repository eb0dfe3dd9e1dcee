"""The Tether's ledger: reachings (questions), drifts (assumptions), change reviews and pipeline
mutations waiting for the operator.

Every status is changed by compare-and-set in `tether.services`; the TextChoices below list the
allowed transitions.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from bursts.models import AgentRun, QuantumRun
from quanta.models import Quantum


class Priority(models.TextChoices):
    """How urgent a reaching is: the queue serves critical > high > normal > low, then the
    earliest deadline."""

    CRITICAL = "critical", "critical"
    HIGH = "high", "high"
    NORMAL = "normal", "normal"
    LOW = "low", "low"


PRIORITY_RANK: dict[str, int] = {
    Priority.CRITICAL: 0,
    Priority.HIGH: 1,
    Priority.NORMAL: 2,
    Priority.LOW: 3,
}


class ReachingStatus(models.TextChoices):
    """pending -> answered | timed_out | cancelled | withdrawn. A timed-out reaching may still
    get one late answer (the late_* fields), which never changes its status. A question about a
    quantum's state (a quarantine) is withdrawn, pending or timed out without a late answer,
    when that state changes; `withdrawn_reason` says why."""

    PENDING = "pending", "pending"
    ANSWERED = "answered", "answered"
    TIMED_OUT = "timed_out", "timed out"
    CANCELLED = "cancelled", "cancelled"
    WITHDRAWN = "withdrawn", "withdrawn"


class Reaching(models.Model):
    """A question to the Tether: from a psychonaut (agent_run set; the agent waits suspended),
    or from the burst manager about a quarantined quantum (agent_run empty)."""

    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.CASCADE, related_name="reachings"
    )
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="reachings")
    tool_use_id = models.CharField(max_length=100, blank=True)
    question = models.TextField()
    context = models.TextField(blank=True, help_text="why the agent asks; failure history")
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
    assumption = models.TextField(help_text="what happens if nobody answers in time")
    deadline = models.DateTimeField()
    status = models.CharField(
        max_length=12, choices=ReachingStatus.choices, default=ReachingStatus.PENDING
    )
    answer = models.TextField(blank=True)
    answered_by = models.CharField(max_length=150, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    late_answer = models.TextField(blank=True)
    late_answered_by = models.CharField(max_length=150, blank=True)
    late_answered_at = models.DateTimeField(null=True, blank=True)
    withdrawn_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One reaching per tool call: a redelivered ask_tether finds its reaching again.
            models.UniqueConstraint(
                fields=["agent_run", "tool_use_id"],
                name="reaching_once_per_call",
                condition=Q(agent_run__isnull=False),
            ),
        ]
        indexes = [
            # The queue rebuild and the deadline sweep: pending reachings by deadline.
            models.Index(
                fields=["deadline"], name="reaching_pending", condition=Q(status="pending")
            ),
        ]

    def __str__(self) -> str:
        return f"reaching {self.pk} [{self.status}]"


class DriftKind(models.TextChoices):
    """answer: an agent went on with its assumption; pipeline: a proposal timed out and the old
    pipeline version stayed in force."""

    ANSWER = "answer", "answer"
    PIPELINE = "pipeline", "pipeline"


class DriftStatus(models.TextChoices):
    """open -> grounded | rejected | superseded (by a late answer). All three are final. A note
    decides nothing: it is added to `notes` and the drift stays open."""

    OPEN = "open", "open"
    GROUNDED = "grounded", "grounded"
    REJECTED = "rejected", "rejected"
    SUPERSEDED = "superseded", "superseded"


class Drift(models.Model):
    """An assumption an agent (or the system) built on without the operator's word."""

    kind = models.CharField(max_length=10, choices=DriftKind.choices, default=DriftKind.ANSWER)
    reaching = models.OneToOneField(
        Reaching, null=True, blank=True, on_delete=models.CASCADE, related_name="drift"
    )
    mutation = models.OneToOneField(
        "PipelineMutation", null=True, blank=True, on_delete=models.CASCADE, related_name="drift"
    )
    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="drifts"
    )
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="drifts")
    assumption = models.TextField()
    rationale = models.TextField(blank=True)
    built_on = models.JSONField(
        default=dict, blank=True, help_text='{"files": [...], "quanta": [ids]} built on it'
    )
    status = models.CharField(max_length=12, choices=DriftStatus.choices, default=DriftStatus.OPEN)
    comment = models.TextField(blank=True)
    notes = models.JSONField(
        default=list, blank=True, help_text='the operator\'s notes: [{"by", "at", "text"}, ...]'
    )
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    correction = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="corrected_drifts"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The grounding queue: drifts by status, newest first.
            models.Index(fields=["status", "-created_at"], name="drift_status_time"),
        ]

    def __str__(self) -> str:
        return f"drift {self.pk} [{self.status}]"


class Risk(models.TextChoices):
    """The risk tier of a change, from the deterministic rules of tether/risk.py."""

    LOW = "low", "low"
    MEDIUM = "medium", "medium"
    HIGH = "high", "high"


class ChangeStatus(models.TextChoices):
    """pending -> queued (approved: waits in the merge queue) | rejected (quantum reopened) |
    superseded (a newer run of the same quantum made a new review).
    queued -> merging (the queue's consumer took it) | pending (its branch moved since the
    review: review it again).
    merging -> merged (verified on the merged result, target moved) | conflicted (merge aborted,
    correction quantum filed) | failed (the checks failed on the merged result; quantum
    reopened) | queued (the target's checkout was in the way: tried again) | pending (branch
    moved). A merging entry whose worker died is taken again by the next consumer."""

    PENDING = "pending", "pending"
    QUEUED = "queued", "queued"
    MERGING = "merging", "merging"
    MERGED = "merged", "merged"
    REJECTED = "rejected", "rejected"
    CONFLICTED = "conflicted", "conflicted"
    FAILED = "failed", "failed checks"
    SUPERSEDED = "superseded", "superseded"

    @classmethod
    def terminal(cls) -> frozenset[str]:
        return frozenset({cls.MERGED, cls.REJECTED, cls.CONFLICTED, cls.FAILED, cls.SUPERSEDED})


CHANGE_IN_QUEUE = (ChangeStatus.QUEUED, ChangeStatus.MERGING)


class ChangeReview(models.Model):
    """The commits a quantum run left on its branch, waiting to be merged into the base."""

    quantum_run = models.OneToOneField(
        QuantumRun, on_delete=models.CASCADE, related_name="change_review"
    )
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="change_reviews")
    branch = models.CharField(max_length=200)
    base = models.CharField(max_length=200, help_text="the branch the change merges into")
    head_sha = models.CharField(max_length=40, help_text="the branch head when reviewed")
    diff = models.TextField(blank=True, help_text="against the base; secrets redacted")
    files = models.JSONField(default=list, blank=True, help_text="[{path, status, +, -}]")
    additions = models.PositiveIntegerField(default=0)
    deletions = models.PositiveIntegerField(default=0)
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.LOW)
    reasons = models.JSONField(default=list, blank=True)
    status = models.CharField(
        max_length=12, choices=ChangeStatus.choices, default=ChangeStatus.PENDING
    )
    merge_sha = models.CharField(max_length=40, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    correction = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    left_out = models.JSONField(
        default=list, blank=True, help_text="untracked files the commit left out (ignored)"
    )
    queued_at = models.DateTimeField(null=True, blank=True, help_text="approved into the queue")
    checks = models.JSONField(
        default=list, blank=True, help_text="the verify checks on the merged result"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The grounding queue: pending changes first, then by age.
            models.Index(fields=["status", "created_at"], name="change_status_time"),
            # The merge queue's next entry: queued or merging changes in approval order.
            models.Index(
                fields=["queued_at", "id"],
                name="change_in_queue",
                condition=Q(status__in=["queued", "merging"]),
            ),
        ]

    def __str__(self) -> str:
        return f"change {self.pk} of #{self.quantum_id} [{self.status}]"


class ReviewDue(models.Model):
    """A done run whose branch has not been reviewed yet. Written when the run is drained, in the
    transaction that closes its quantum; removed once the review task has looked at the branch
    (a review made, or no change found). While one is due, nothing may take the closed quantum
    for one that made no change; the sweep sends the task again for one due too long."""

    quantum_run = models.OneToOneField(
        QuantumRun, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="+")
    due_at = models.DateTimeField(help_text="when the run was drained")
    sent_at = models.DateTimeField(help_text="when the review task was last sent")

    def __str__(self) -> str:
        return f"review due for run {self.quantum_run_id} of #{self.quantum_id}"


class MutationStatus(models.TextChoices):
    """pending -> approved (a new pipeline version) | rejected | timed_out (a pipeline drift;
    the old version stays)."""

    PENDING = "pending", "pending"
    APPROVED = "approved", "approved"
    REJECTED = "rejected", "rejected"
    TIMED_OUT = "timed_out", "timed out"


class PipelineMutation(models.Model):
    """A psychonaut's proposal to change a pipeline; nothing changes until the operator says so."""

    pipeline_name = models.CharField(max_length=100)
    base_version = models.PositiveIntegerField(help_text="0 = a new pipeline")
    proposed_yaml = models.TextField()
    rationale = models.TextField(blank=True)
    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="mutations"
    )
    quantum = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.SET_NULL, related_name="mutations"
    )
    tool_use_id = models.CharField(max_length=100, blank=True)
    deadline = models.DateTimeField()
    status = models.CharField(
        max_length=12, choices=MutationStatus.choices, default=MutationStatus.PENDING
    )
    resulting_version = models.PositiveIntegerField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One proposal per tool call: a re-executed call finds its proposal again.
            models.UniqueConstraint(
                fields=["agent_run", "tool_use_id"],
                name="mutation_once_per_call",
                condition=Q(agent_run__isnull=False),
            ),
        ]
        indexes = [
            # The deadline sweep: pending proposals by deadline.
            models.Index(
                fields=["deadline"], name="mutation_pending", condition=Q(status="pending")
            ),
        ]

    def __str__(self) -> str:
        return f"mutation {self.pk} of {self.pipeline_name} [{self.status}]"
