"""The Tether's events: their topics and names (past tense), the contract of every reader (the
Tether's pages and their scripts, the webhooks, the CLI)."""

from __future__ import annotations

from enum import StrEnum
from typing import TypedDict

REACHINGS_TOPIC = "tether:reaching"  # questions to the operator and their answers
CHANGES_TOPIC = "tether:drifts"  # the grounding queue: drifts and change reviews
QUESTIONS_TOPIC = "tether:questions"  # pipeline mutations proposed by agents


class TetherEventType(StrEnum):
    # REACHINGS_TOPIC
    QUESTION_ASKED = "question_asked"
    QUESTION_ANSWERED = "question_answered"
    LATE_ANSWER_RECEIVED = "late_answer_received"  # after its timeout: the drift is decided
    QUESTION_TIMED_OUT = "question_timed_out"
    QUESTION_WITHDRAWN = "question_withdrawn"
    QUESTION_CANCELLED = "question_cancelled"
    # CHANGES_TOPIC: drifts
    DRIFT_CREATED = "drift_created"
    PIPELINE_DRIFT_CREATED = "pipeline_drift_created"
    DRIFT_CONFIRMED = "drift_confirmed"
    DRIFT_REJECTED = "drift_rejected"
    DRIFT_SUPERSEDED = "drift_superseded"
    DRIFT_NOTED = "drift_noted"
    # CHANGES_TOPIC: change reviews
    CHANGE_REVIEW_CREATED = "change_review_created"
    CHANGE_QUEUED = "change_queued"
    CHANGE_MERGE_STARTED = "change_merge_started"
    CHANGE_MERGED = "change_merged"
    CHANGE_CONFLICTED = "change_conflicted"
    CHANGE_FAILED = "change_failed"
    CHANGE_RETURNED = "change_returned"
    CHANGE_BLOCKED = "change_blocked"
    CHANGE_REJECTED = "change_rejected"
    # QUESTIONS_TOPIC
    PIPELINE_MUTATION_SUBMITTED = "pipeline_mutation_submitted"
    PIPELINE_MUTATION_RESPONDED = "pipeline_mutation_responded"


class ReachingPayload(TypedDict):
    """What the question events say about a reaching (the UI's question card, the webhook
    `reaching.created`); an answer's events add `answer`."""

    reaching_id: int
    quantum_id: int
    agent_run_id: int | None
    question: str
    priority: str
    assumption: str
    deadline: str
    status: str


class ChangePayload(TypedDict):
    """What the change review events say (the webhook `change.submitted`): never the diff (it
    could hold what the redaction missed); a decision's events add `by`."""

    change_id: int
    quantum_id: int
    branch: str
    base: str
    risk: str
    reasons: list[str]
    additions: int
    deletions: int
    files: int
    status: str


class MutationPayload(TypedDict):
    mutation_id: int
    pipeline: str
    base_version: int
    status: str
    agent_run_id: int | None
    quantum_id: int | None
    rationale: str
    deadline: str
    resulting_version: int | None
