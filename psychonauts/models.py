"""The agent runtime's durable state: roles, turn checkpoints, tool calls, usage, mail, diary."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, URLValidator
from django.db import models
from django.db.models import Q

from bursts.models import AgentRun, QuantumRun, Wave
from quanta.models import Complexity, Quantum


class Role(models.Model):
    """A psychonaut template: seeded from YAML (`psychonauts/roles/*.yaml`), editable in admin."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)
    system_prompt = models.TextField()
    provider = models.CharField(max_length=50, default="scripted")
    model = models.CharField(max_length=100, blank=True, help_text="blank = routed by complexity")
    allowed_tools = models.JSONField(default=list, blank=True)
    max_turns = models.PositiveIntegerField(default=30)
    timeout_s = models.PositiveIntegerField(default=1800)
    # Who runs the agent's loop: our own (`ours`) or an agent CLI inside our sandbox
    # (`psychonauts.executors`).
    executor = models.CharField(
        max_length=20,
        default="ours",
        choices=[("ours", "ours"), ("claude-code", "claude-code"), ("codex", "codex")],
    )
    source = models.CharField(max_length=500, blank=True, help_text="YAML file it came from")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentTurn(models.Model):
    """One checkpointed turn: the assistant message and, once complete, the tool results.

    A turn is written as soon as the provider answers (complete=False) and completed after its
    tool calls ran; a resumed run replays complete turns and finishes an incomplete one.
    """

    # db_index=False: agentturn_unique (agent_run, index) serves lookups by run.
    agent_run = models.ForeignKey(
        AgentRun, on_delete=models.CASCADE, related_name="turns", db_index=False
    )
    index = models.PositiveIntegerField()
    assistant = models.JSONField(default=list, help_text="content blocks of the assistant reply")
    tool_results = models.JSONField(default=list, help_text="tool_result blocks sent back")
    stop_reason = models.CharField(max_length=50, blank=True)
    complete = models.BooleanField(default=False)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    prompt = models.TextField(
        blank=True,
        default="",
        help_text="the first message of the conversation this turn opens (redacted); a resumed "
        "run reads it back instead of building it again; empty on the turns after it",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent_run", "index"]
        constraints = [
            # Also the index that loads a run's checkpoint in order.
            models.UniqueConstraint(fields=["agent_run", "index"], name="agentturn_unique"),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} of run {self.agent_run_id}"


class ToolCall(models.Model):
    """A tool call and its result. Completed rows are never executed again (resume)."""

    # db_index=False: toolcall_unique (agent_run, tool_use_id) serves lookups by run.
    agent_run = models.ForeignKey(
        AgentRun, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    turn_index = models.PositiveIntegerField()
    tool_use_id = models.CharField(max_length=100)
    name = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    output = models.TextField(blank=True)
    is_error = models.BooleanField(default=False)
    completed = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Resume looks a call up by its id; a call is recorded once.
            models.UniqueConstraint(fields=["agent_run", "tool_use_id"], name="toolcall_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tool_use_id}) of run {self.agent_run_id}"


class Usage(models.Model):
    """One provider call: what it cost. Budgets sum these per quantum run and per wave."""

    agent_run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="usage")
    # db_index=False: indexed once each, by usage_quantum_run and usage_wave below.
    quantum_run = models.ForeignKey(
        QuantumRun,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="usage",
        db_index=False,
    )
    wave = models.ForeignKey(
        Wave, null=True, blank=True, on_delete=models.CASCADE, related_name="usage", db_index=False
    )
    provider = models.CharField(max_length=50)
    model = models.CharField(max_length=100)
    # Input tokens read from no cache and written to none; the prompt cache's reads and writes
    # (five minutes, one hour) are apart, each priced at its share of the input price.
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    cache_write_long_tokens = models.PositiveIntegerField(default=0)
    # 0 and priced False when the model's price is unknown (neither the registry nor
    # PSYCHONAUTS_PRICES gives one): the call is shown as of unknown cost, never guessed.
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    priced = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "usage"
        indexes = [
            # Budget check before each call: spend of a quantum run.
            models.Index(fields=["quantum_run"], name="usage_quantum_run"),
            # Budget check before each call: spend of a wave.
            models.Index(fields=["wave"], name="usage_wave"),
        ]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} " + (
            f"${self.cost_usd}" if self.priced else "(price unknown)"
        )


class Mail(models.Model):
    """Agent-to-agent mailbox: a message to an agent id (or a role within a quantum)."""

    sender = models.CharField(max_length=200)
    recipient = models.CharField(max_length=200)
    quantum = models.ForeignKey(
        Quantum, null=True, blank=True, on_delete=models.CASCADE, related_name="mail"
    )
    subject = models.CharField(max_length=300, blank=True)
    body = models.TextField()
    read_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "mail"
        indexes = [
            # mail_read(): a recipient's unread messages, oldest first.
            models.Index(
                fields=["recipient", "created_at"], name="mail_unread", condition=Q(read_at=None)
            ),
        ]

    def __str__(self) -> str:
        return f"mail {self.sender} -> {self.recipient}"


class DiaryKind(models.TextChoices):
    ACCOMPLISHMENT = "accomplishment", "accomplishment"
    DECISION = "decision", "decision"
    CHALLENGE = "challenge", "challenge"
    LEARNING = "learning", "learning"


class DiarySource(models.TextChoices):
    """Who wrote a diary entry: the agent (the `diary` tool) or reflection's reflector, reading
    the run's session afterwards."""

    AGENT = "agent", "the agent"
    REFLECTOR = "reflector", "the reflector"


class DiaryEntry(models.Model):
    """What an agent run accomplished, decided, ran into or learned (read by reflection)."""

    agent_run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="diary")
    kind = models.CharField(max_length=20, choices=DiaryKind.choices)
    text = models.TextField()
    source = models.CharField(max_length=10, choices=DiarySource.choices, default=DiarySource.AGENT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "diary entries"

    def __str__(self) -> str:
        return f"{self.kind} of run {self.agent_run_id}"


class TraumaSource(models.TextChoices):
    """Who recorded a trauma."""

    OPERATOR = "operator", "entered by the operator"
    GUARD = "guard", "a dangerous command the guard refused"
    SANDBOX = "sandbox", "a command that ran into a sandbox boundary"
    LOOP = "loop", "a call an agent repeated with the same result until it was stopped"


class CommandTrauma(models.Model):
    """A command pattern that caused an incident: the guard escalates it one tier.

    One an agent's command recorded applies to that agent's quantum only (`quantum`): an agent
    must not change what the others may run. It applies to every quantum once the operator
    confirms it (`confirmed_at`, quantum cleared); one the operator enters applies everywhere
    unless it names a quantum.
    """

    pattern = models.CharField(max_length=300, help_text="regular expression")
    reason = models.TextField()
    active = models.BooleanField(default=True)
    source = models.CharField(
        max_length=10, choices=TraumaSource.choices, default=TraumaSource.OPERATOR
    )
    agent_id = models.CharField(max_length=200, blank=True, help_text="whose command it was")
    # An id, not a foreign key: a trauma outlives its quantum's deletion harmlessly, and the
    # runtime records one for whatever quantum id its agent ran under.
    quantum_id = models.PositiveIntegerField(
        null=True, blank=True, help_text="the only quantum it applies to; empty: every quantum"
    )
    confirmed_by = models.CharField(
        max_length=150, blank=True, help_text="the operator who made it apply to every quantum"
    )
    confirmed_at = models.DateTimeField(null=True, blank=True)
    hits = models.PositiveIntegerField(default=1, help_text="incidents recorded for it")
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "command traumas"

    def __str__(self) -> str:
        return self.pattern


class Verification(models.Model):
    """One run of a quantum's verify commands at the end of an agent's turn loop (a round).

    A failed round is fed back to the same agent (build-verify-fix) until the stage's retries are
    spent. `commit_sha` is the commit verified: the runtime commits the agent's work first, so the
    checks ran on exactly that tree.
    """

    agent_run = models.ForeignKey(
        AgentRun, on_delete=models.CASCADE, related_name="verifications", db_index=False
    )
    # db_index=False: verification_quantum below serves the quantum page.
    quantum = models.ForeignKey(
        Quantum, on_delete=models.CASCADE, related_name="verifications", db_index=False
    )
    round = models.PositiveSmallIntegerField(help_text="1 = the first final answer's check")
    passed = models.BooleanField()
    checks = models.JSONField(default=list, help_text="each command's result (verify.CheckData)")
    commit_sha = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Focus lists a run's rounds in order; the runtime counts them to know the next one.
            models.UniqueConstraint(fields=["agent_run", "round"], name="verification_unique"),
        ]
        indexes = [
            # The quantum page: a quantum's verifications, newest first.
            models.Index(fields=["quantum", "-created_at"], name="verification_quantum"),
        ]

    def __str__(self) -> str:
        return f"verification {self.round} of run {self.agent_run_id}"


# An environment variable's name: the registry names where a key is, never the key itself.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def validate_key_env(value: str) -> None:
    """The name of an environment variable, and not a key pasted in its place (the usual key
    prefixes, or longer than a variable's name would be)."""
    if value.startswith(("sk-", "sk_", "Bearer")) or not ENV_NAME_RE.fullmatch(value):
        raise ValidationError(
            "the NAME of an environment variable holding the key (e.g. VLLM_API_KEY), "
            "never the key itself"
        )


class EndpointProvider(models.TextChoices):
    OPENAI = "openai", "OpenAI-compatible (Ollama, vLLM, llama.cpp, a gateway)"
    ANTHROPIC = "anthropic", "Anthropic Messages API"


class HealthStatus(models.TextChoices):
    """What the last health check found. unknown -> up | down; up <-> down (the beat's checks,
    `psychonauts.routing.endpoints.endpoint_health_record`, compare-and-set)."""

    UNKNOWN = "unknown", "not checked yet"
    UP = "up", "up"
    DOWN = "down", "down"


class Endpoint(models.Model):
    """A model endpoint of the registry (`psychonauts.routing.endpoints`): where a tier's runs may go.

    Routing picks among the enabled endpoints of a run's tier that are not down, preferring
    the least loaded; each holds at most `max_concurrency` model calls at once across every
    worker. Its prices feed the cost accounting of its model.
    """

    name = models.SlugField(max_length=100, unique=True)
    provider = models.CharField(
        max_length=20, choices=EndpointProvider.choices, default=EndpointProvider.OPENAI
    )
    model = models.CharField(max_length=100, help_text="the model name the endpoint expects")
    base_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="e.g. http://localhost:11434/v1; blank = the SDK's",
        validators=[URLValidator(schemes=["http", "https"])],
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="the NAME of the environment variable holding the key (never the key)",
        validators=[validate_key_env],
    )
    tier = models.CharField(max_length=10, choices=Complexity.choices, default=Complexity.STANDARD)
    max_concurrency = models.PositiveIntegerField(
        default=4, validators=[MinValueValidator(1)], help_text="model calls at once, all workers"
    )
    usd_per_mtok_in = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True,
        help_text="USD per million input tokens; blank = PSYCHONAUTS_PRICES",
    )  # fmt: skip
    usd_per_mtok_out = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True,
        help_text="USD per million output tokens; blank = PSYCHONAUTS_PRICES",
    )  # fmt: skip
    enabled = models.BooleanField(default=True)
    context_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1024)],
        help_text="the model's context size in tokens (the server's n_ctx); each request is "
        "kept within it by trimming old tool results; blank = not bounded here",
    )
    text_tool_calls = models.BooleanField(
        default=False,
        help_text="take tool calls the model writes as text (a fenced JSON object of `name` and "
        "`arguments`, or <tool_call> tags) as tool calls, strictly",
    )
    health = models.CharField(
        max_length=10, choices=HealthStatus.choices, default=HealthStatus.UNKNOWN
    )
    health_reason = models.CharField(max_length=500, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tier", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_concurrency__gte=1), name="endpoint_concurrency_positive"
            ),
            models.CheckConstraint(
                condition=Q(provider__in=EndpointProvider.values), name="endpoint_provider_known"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.provider} {self.model})"


class SandboxIdentity(models.Model):
    """The uid one holder's sandboxed commands run as (a root worker): SANDBOX_UID_BASE + slot.

    A holder is a quantum (`q<id>`) or one of the runtime's own identities (the shared tree, the
    scanners, the base check). No two rows share a slot, so no two holders share a uid: the
    kernel's per-uid process limit and signals never cross from one to another. A row is live
    while `released_at` is empty; its holder gets the same slot back when it comes again, and
    another holder takes it over only after it has been released (or left unrenewed) for long
    enough that nothing can still run under it (psychonauts/containment/identities.py).
    """

    holder = models.CharField(max_length=40, unique=True)
    slot = models.PositiveIntegerField(unique=True)
    renewed_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Taking over a slot when none is free: the released (or stale) row renewed longest ago.
            models.Index(fields=["renewed_at"], name="sandboxidentity_renewed"),
        ]

    def __str__(self) -> str:
        return f"{self.holder} -> slot {self.slot}"


from psychonauts.environments.models import (  # noqa: E402, F401
    BuildStatus,
    EnvironmentBuild,
    EnvironmentWaiter,
)
