"""What the API accepts and returns. Inputs refuse unknown fields; values are checked by the
services of each app (their messages name the field), types and shapes here."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

from ninja import Field, Schema
from pydantic import ConfigDict


class In(Schema):
    model_config = ConfigDict(extra="forbid")


class FieldErrorOut(Schema):
    field: str
    message: str


class ProblemOut(Schema):
    """RFC 9457 problem details (application/problem+json)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    errors: list[FieldErrorOut] | None = None


# --- quanta ------------------------------------------------------------------------------------


class QuantumOut(Schema):
    id: int
    repository_id: int
    title: str
    body: str
    kind: str
    status: str
    priority: int
    labels: list[str]
    parent_id: int | None
    pipeline: str
    acceptance: str
    verify_commands: list[str]
    complexity: str
    complexity_auto: bool
    close_reason: str
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None


class QuantumPage(Schema):
    items: list[QuantumOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class SearchHitOut(Schema):
    quantum: QuantumOut
    rank: float


class SearchPage(Schema):
    items: list[SearchHitOut]
    next_cursor: str | None


class QuantumCreateIn(In):
    title: str
    body: str = ""
    kind: str = "task"
    priority: int = 2
    labels: list[str] = []
    parent_id: int | None = None
    pipeline: str = ""
    acceptance: str = ""
    verify_commands: list[str] = []
    complexity: str | None = Field(None, description="trivial | standard | complex; null: auto")
    depends_on: list[int] = Field([], description="ids of quanta this one waits on (blocks)")
    repository_id: int | None = Field(
        None, description="its repository; null: the parent's or the default"
    )


class QuantumUpdateIn(In):
    title: str | None = None
    body: str | None = None
    kind: str | None = None
    priority: int | None = None
    labels: list[str] | None = None
    pipeline: str | None = None
    acceptance: str | None = None
    verify_commands: list[str] | None = None
    complexity: str | None = Field(None, description="trivial | standard | complex | auto")
    parent_id: int | None = None
    clear_parent: bool = False


class ReasonIn(In):
    reason: str


class ImportIn(In):
    format: Literal["yaml", "jsonl"] = "yaml"
    text: str = Field(description="the file's content, as `manage.py quanta import` reads it")


class ImportOut(Schema):
    ids: list[int]


# --- goals -------------------------------------------------------------------------------------


class GoalOut(Schema):
    id: int
    repository_id: int
    title: str
    description: str
    success_criteria: str
    verify_commands: list[str]
    priority: int
    labels: list[str]
    budget_usd: Decimal | None
    source: str
    status: str
    reason: str
    epic_id: int | None
    created_by: str
    approved_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class GoalPage(Schema):
    items: list[GoalOut]
    next_cursor: str | None


class GoalCreateIn(In):
    title: str
    success_criteria: str
    description: str = ""
    verify_commands: list[str] = []
    priority: int = 2
    labels: list[str] = []
    budget_usd: Decimal | None = None
    repository_id: int | None = Field(None, description="its repository; null: the default")


class GoalAbandonIn(In):
    reason: str = ""


# --- waves -------------------------------------------------------------------------------------


class WaveOut(Schema):
    id: int
    repository_id: int
    status: str
    labels: list[str]
    continuous: bool
    max_bursts: int
    bursts: int = Field(validation_alias="burst_count")
    started_by: str
    error: str
    started_at: datetime
    finished_at: datetime | None


class WavePage(Schema):
    items: list[WaveOut]
    next_cursor: str | None


class WaveStartIn(In):
    labels: list[str] = []
    continuous: bool = False
    max_bursts: int | None = Field(None, ge=1)
    repository_id: int | None = Field(None, description="whose ready quanta; null: the default")


# --- repositories ------------------------------------------------------------------------------


class RepositoryOut(Schema):
    id: int
    name: str
    location: str
    target_branch: str
    verify_commands: list[str]
    environment: str
    is_default: bool
    created_at: datetime


class RepositoryCreateIn(In):
    name: str
    location: str = Field(description="a local git repository's absolute path, or its URL")
    target_branch: str = Field("", description="empty: the branch checked out")
    verify_commands: list[str] = []
    environment: str = Field("", description="the environment declaration, YAML or JSON text")


class RepositoryUpdateIn(In):
    target_branch: str | None = None
    verify_commands: list[str] | None = None
    environment: str | None = None


class WaveStatusOut(Schema):
    wave: WaveOut
    runs: dict[str, int]
    agents: dict[str, int]
    stages: dict[str, int]


class WaveCancelIn(In):
    reason: str = "cancelled through the API"


# --- the Tether --------------------------------------------------------------------------------


class QuestionOut(Schema):
    id: int
    quantum_id: int
    agent_run_id: int | None
    question: str
    context: str
    priority: str
    assumption: str
    deadline: datetime
    status: str
    answer: str
    answered_by: str
    answered_at: datetime | None
    created_at: datetime


class QuestionPage(Schema):
    items: list[QuestionOut]
    next_cursor: str | None


class AnswerIn(In):
    text: str


class AnswerOut(Schema):
    kind: str
    reaching_id: int
    resumed: bool
    drift_id: int | None
    correction_id: int | None


class DriftOut(Schema):
    id: int
    kind: str
    quantum_id: int
    agent_run_id: int | None
    assumption: str
    rationale: str
    status: str
    comment: str
    decided_by: str
    decided_at: datetime | None
    correction_id: int | None
    created_at: datetime


class DriftPage(Schema):
    items: list[DriftOut]
    next_cursor: str | None


class GroundIn(In):
    comment: str = ""


class ChangeFileOut(Schema):
    path: str
    status: str
    additions: int
    deletions: int
    diff: str


class ChangeOut(Schema):
    id: int
    quantum_id: int
    branch: str
    base: str
    head_sha: str
    risk: str
    reasons: list[str]
    additions: int
    deletions: int
    status: str
    merge_sha: str
    decided_by: str
    decided_at: datetime | None
    comment: str
    queued_at: datetime | None
    created_at: datetime


class ChangeDetailOut(Schema):
    change: ChangeOut
    files: list[ChangeFileOut]


class ChangePage(Schema):
    items: list[ChangeOut]
    next_cursor: str | None


# --- tokens ------------------------------------------------------------------------------------


class TokenOut(Schema):
    id: int
    name: str
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
