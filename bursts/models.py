"""Runs: a Wave repeats Bursts; a Burst runs QuantumRuns; a QuantumRun runs AgentRuns by stage."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from core.workers import worker_host
from quanta.models import Quantum
from repos.services import default_repository_id


class WaveStatus(models.TextChoices):
    """running -> done | cancelled | failed (hit max bursts, or an internal error)."""

    RUNNING = "running", "running"
    DONE = "done", "done"
    CANCELLED = "cancelled", "cancelled"
    FAILED = "failed", "failed"


WAVE_TERMINAL: frozenset[str] = frozenset(
    {WaveStatus.DONE, WaveStatus.CANCELLED, WaveStatus.FAILED}
)


class Wave(models.Model):
    # The repository whose quanta the wave runs; made without one: the default repository.
    repository = models.ForeignKey(
        "repos.Repository",
        on_delete=models.PROTECT,
        related_name="waves",
        default=default_repository_id,
    )
    status = models.CharField(max_length=16, choices=WaveStatus.choices, default=WaveStatus.RUNNING)
    labels = ArrayField(
        models.CharField(max_length=64), default=list, blank=True, help_text="scope; empty = all"
    )
    continuous = models.BooleanField(default=False)
    max_bursts = models.PositiveIntegerField(default=100)
    burst_count = models.PositiveIntegerField(default=0)
    budget_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    started_by = models.CharField(max_length=150, blank=True)
    error = models.TextField(blank=True)
    stats = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The beat safety net and the dashboard: waves still running.
            models.Index(fields=["status"], name="wave_status", condition=Q(status="running")),
        ]

    def __str__(self) -> str:
        return f"wave {self.pk} [{self.status}]"


class BurstPhase(models.TextChoices):
    """collecting -> running -> draining -> done (the next burst starts collecting)."""

    COLLECTING = "collecting", "collecting"
    RUNNING = "running", "running"
    DRAINING = "draining", "draining"
    DONE = "done", "done"


class Burst(models.Model):
    wave = models.ForeignKey(Wave, on_delete=models.CASCADE, related_name="bursts")
    number = models.PositiveIntegerField()
    phase = models.CharField(
        max_length=16, choices=BurstPhase.choices, default=BurstPhase.COLLECTING
    )
    stats = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["wave", "number"], name="burst_number_unique")
        ]

    def __str__(self) -> str:
        return f"wave {self.wave_id} burst {self.number} [{self.phase}]"


class RunStatus(models.TextChoices):
    """pending -> running -> done | error | cancelled."""

    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    DONE = "done", "done"
    ERROR = "error", "error"
    CANCELLED = "cancelled", "cancelled"


RUN_TERMINAL: frozenset[str] = frozenset({RunStatus.DONE, RunStatus.ERROR, RunStatus.CANCELLED})


class QuantumRun(models.Model):
    """One quantum through one pipeline, with the pipeline snapshot it started with."""

    # No single-column indexes on the keys: the composite indexes below lead with each of them,
    # and every index is one more write per run transition (a status change is never HOT).
    wave = models.ForeignKey(Wave, on_delete=models.CASCADE, related_name="runs", db_index=False)
    burst = models.ForeignKey(Burst, on_delete=models.CASCADE, related_name="runs", db_index=False)
    quantum = models.ForeignKey(
        Quantum, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    pipeline_name = models.CharField(max_length=100)
    pipeline_version = models.PositiveIntegerField(default=1)
    pipeline_snapshot = models.JSONField(default=dict)
    current_stage = models.PositiveIntegerField(default=0)
    branch = models.CharField(max_length=200, blank=True)
    error_reason = models.TextField(blank=True)
    # One entry per stage reached: {"index", "name", "status", "reason"}; status is
    # running | skipped | all_succeeded | has_failures | sequential_blocked | cancelled.
    stages = models.JSONField(default=list, blank=True)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="when the current stage was last sent to Celery"
    )
    drained_at = models.DateTimeField(
        null=True, blank=True, help_text="when the manager applied the outcome to the quantum"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A quantum runs at most once per burst.
            models.UniqueConstraint(fields=["burst", "quantum"], name="quantumrun_once_per_burst"),
        ]
        indexes = [
            # Is the burst drained? runs of a burst by status.
            models.Index(fields=["burst", "status"], name="quantumrun_burst_status"),
            # Failure history of a quantum (quarantine after N consecutive failures).
            models.Index(fields=["quantum", "created_at"], name="quantumrun_quantum_time"),
            # The manager's wave-wide questions: live runs, runs not drained, failed quanta.
            models.Index(fields=["wave", "status"], name="quantumrun_wave_status"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} of #{self.quantum_id} [{self.status}]"


class AgentStatus(models.TextChoices):
    """pending -> running <-> waiting (on the Tether) -> done | error | cancelled."""

    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    WAITING = "waiting", "waiting"
    DONE = "done", "done"
    ERROR = "error", "error"
    CANCELLED = "cancelled", "cancelled"


AGENT_TERMINAL: frozenset[str] = frozenset(
    {AgentStatus.DONE, AgentStatus.ERROR, AgentStatus.CANCELLED}
)
# Not ended: may be claimed (again) by an execution.
AGENT_LIVE: frozenset[str] = frozenset(
    {AgentStatus.PENDING, AgentStatus.RUNNING, AgentStatus.WAITING}
)


class AgentPhase(models.TextChoices):
    """What the agent is doing right now (published on `agent:<id>`)."""

    IDLE = "idle", "idle"
    THINKING = "thinking", "thinking"
    TOOL_USE = "tool_use", "tool use"
    WAITING = "waiting", "waiting"
    DONE = "done", "done"
    ERROR = "error", "error"


class AgentRun(models.Model):
    """One psychonaut executing one role: in a stage of a QuantumRun, alone from the CLI, or
    as a sub-agent spawned by another agent run.

    agent_id is `{quantum_id}_s{stage_index}_{role}` (the seed's format); attempts count retries.
    """

    agent_id = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=1)
    quantum = models.ForeignKey(Quantum, on_delete=models.CASCADE, related_name="agent_runs")
    # Indexed by `agentrun_stage` (quantum_run, stage_index, position): an index of its own
    # cost one more write per agent start and finish.
    quantum_run = models.ForeignKey(
        QuantumRun,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agent_runs",
        db_index=False,
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    depth = models.PositiveSmallIntegerField(default=0, help_text="0 = top level; spawn adds 1")
    stage_index = models.PositiveIntegerField(default=0)
    position = models.PositiveIntegerField(default=0, help_text="order within a sequential stage")
    role = models.CharField(max_length=100)
    status = models.CharField(
        max_length=16, choices=AgentStatus.choices, default=AgentStatus.PENDING
    )
    phase = models.CharField(max_length=16, choices=AgentPhase.choices, default=AgentPhase.IDLE)
    provider = models.CharField(max_length=50, blank=True)
    model = models.CharField(max_length=100, blank=True)
    context = models.TextField(
        blank=True, help_text="threaded results of earlier stages and agents"
    )
    result = models.TextField(blank=True)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    task_id = models.CharField(
        max_length=64,
        blank=True,
        help_text="the Celery task sent for this attempt (revoked if the wave is cancelled)",
    )
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "attempt"], name="agentrun_attempt_unique"),
        ]
        indexes = [
            # Stage evaluation: the agents of a run's stage.
            models.Index(fields=["quantum_run", "stage_index", "position"], name="agentrun_stage"),
            # The beat safety net and the registry rebuild: agents not yet terminal.
            models.Index(
                fields=["status"],
                name="agentrun_live",
                condition=Q(status__in=["pending", "running", "waiting"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}#{self.attempt} [{self.status}]"

    @property
    def host(self) -> str:
        """The host its worker runs on (the worker's first part; "" before it starts)."""
        return worker_host(self.worker)
