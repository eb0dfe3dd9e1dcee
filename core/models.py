"""The append-only event stream: every lifecycle change in the system is an Event row."""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models.expressions import RawSQL


class Session(models.Model):
    """A thread of events: one per wave, burst, agent run or reflection pass."""

    class Kind(models.TextChoices):
        WAVE = "wave", "wave"
        BURST = "burst", "burst"
        AGENT_RUN = "agent_run", "agent run"
        REFLECTION = "reflection", "reflection"
        OPERATOR = "operator", "operator"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    ref = models.CharField(max_length=200, help_text="id of what the session follows")
    title = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # session_for(kind, ref): find the session of a wave / burst / agent run.
            models.Index(fields=["kind", "ref"], name="session_kind_ref"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.ref}"


class Event(models.Model):
    """One published event. The id is the global sequence clients catch up from.

    Append-only: a database trigger (migration 0002) refuses UPDATE on this table.
    """

    # db_index=False: event_session_seq (session, id) serves lookups by session.
    session = models.ForeignKey(
        Session,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
    )
    topic = models.CharField(max_length=200)
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    search = models.GeneratedField(
        expression=RawSQL("jsonb_to_tsvector('english'::regconfig, payload, '[\"string\"]')", []),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        indexes = [
            # events_after(topics, seq): a reconnecting client catches up on its topics.
            models.Index(fields=["topic", "id"], name="event_topic_seq"),
            # session transcript, in order.
            models.Index(fields=["session", "id"], name="event_session_seq"),
            # events_search(query): full-text search over string values of the payload.
            GinIndex(fields=["search"], name="event_search"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.topic} {self.type}"


class Access(models.Model):
    """Holds the `core.operate` permission; no table (operators are a group that has it).

    Operators may start and cancel waves, answer, ground and approve; viewers only look.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("operate", "Can act in the control room (waves, answers, approvals)")]

    def __str__(self) -> str:
        return "control room access"
