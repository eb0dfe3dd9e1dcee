"""GitHub's deliveries in: verified, refused when replayed, and acted on.

- `push` to the base branch wakes the scheduler (the autopilot's tick, sent after commit);
- `check_run` / `workflow_run` completed with a failure on the base branch files a healing
  quantum, one open at a time per check or workflow;
- `issues` opened, reopened or labelled with HOOKS_GITHUB_ISSUE_LABEL becomes a quantum, once
  per issue;
- `pull_request`, `pull_request_review`, `pull_request_review_comment`, `check_suite` and
  `check_run` about one of our pull requests send its sync (forges: the forge is read again
  and the change sent back, approved, merged or closed);
- `ping` is answered.

The delivery's row (its id unique) and what it filed are one transaction: a replay fails on
the row's unique id and is refused, its actions rolled back; a delivery that fails writes
neither.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from autopilot.labels import filed_labels
from core.celery import app
from core.redaction import redact
from core.safetext import text_problem
from forges.services import github_delivery
from hooks.errors import WebhookRefused
from hooks.models import GithubDelivery, GithubLink
from quanta.errors import QuantaError
from quanta.models import Quantum, QuantumStatus
from quanta.services import quantum_create

logger = logging.getLogger(__name__)

PULL_EVENTS = ("pull_request", "pull_request_review", "pull_request_review_comment", "check_suite")
EVENTS = ("ping", "push", "check_run", "workflow_run", "issues", *PULL_EVENTS)
FAILED = frozenset({"failure", "timed_out", "startup_failure"})
ISSUE_ACTIONS = frozenset({"opened", "reopened", "labeled"})
WAKE_TASK = "autopilot.tick"
BODY_QUOTE = 8_000
MAX_DEPTH = 64  # GitHub's deepest payloads nest about ten levels


@dataclass(frozen=True)
class Received:
    """What a delivery did: `outcome` in words, the quantum it filed or found."""

    delivery_id: str
    event: str
    outcome: str
    quantum_id: int | None = None


def signature_ok(secret: str, body: bytes, header: str) -> bool:
    """`header` is `sha256=` and the HMAC-SHA256 of the body under `secret` (compared in
    constant time)."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("ascii", "replace"))


def github_check(*, body: bytes, signature: str, event: str, delivery_id: str) -> dict[str, Any]:
    """The delivery's payload once everything about it is acceptable; WebhookRefused (with the
    HTTP status to answer) otherwise. Checks the signature before reading anything else."""
    secret = settings.HOOKS_GITHUB_SECRET
    if not secret:
        raise WebhookRefused(
            503, "Webhooks not configured", "set ANNIHILATION_GITHUB_WEBHOOK_SECRET to receive them"
        )
    if len(body) > settings.HOOKS_GITHUB_MAX_BYTES:
        raise WebhookRefused(
            413, "Delivery too large",
            f"the body is over the limit of {settings.HOOKS_GITHUB_MAX_BYTES} bytes",
        )  # fmt: skip
    if not signature:
        raise WebhookRefused(401, "Signature missing", "X-Hub-Signature-256 is required")
    if not signature_ok(secret, body, signature):
        raise WebhookRefused(
            401, "Bad signature", "X-Hub-Signature-256 does not match the body under the secret"
        )
    if not delivery_id or len(delivery_id) > 100:
        raise WebhookRefused(400, "Delivery id missing", "X-GitHub-Delivery is required")
    if event not in EVENTS:
        raise WebhookRefused(
            400, "Unknown event type",
            f"X-GitHub-Event {event[:50]!r} is not one of {', '.join(EVENTS)}",
        )  # fmt: skip
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WebhookRefused(400, "Malformed JSON", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise WebhookRefused(
            400, "Malformed JSON", "the body is nested too deeply to be read"
        ) from None
    if not isinstance(payload, dict):
        raise WebhookRefused(400, "Malformed payload", "the body must be a JSON object")
    problem = _payload_problem(payload)
    if problem is not None:
        raise WebhookRefused(400, "Malformed payload", problem)
    return payload


def _payload_problem(payload: dict[str, Any]) -> str | None:
    """Why the parsed body cannot be acted on, or None. JSON may carry what no text column takes
    (a lone surrogate escape such as `\\ud800`, a NUL) and nesting no GitHub event has; every
    string anywhere in it, keys too, is checked, iteratively (the depth is what is refused)."""
    pending: list[tuple[str, Any, int]] = [("", payload, 1)]
    while pending:
        path, value, depth = pending.pop()
        if depth > MAX_DEPTH:
            return f"the body is nested more than {MAX_DEPTH} levels deep"
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                return f"{_where(path)}: a string {problem}"
        elif isinstance(value, dict):
            for key, item in value.items():
                problem = text_problem(key)
                if problem is not None:
                    return f"{_where(path)}: a key {problem}"
                pending.append((f"{path}.{key}" if path else key, item, depth + 1))
        elif isinstance(value, list):
            pending += [(f"{path}[{n}]", item, depth + 1) for n, item in enumerate(value)]
    return None


def github_receive(*, body: bytes, signature: str, event: str, delivery_id: str) -> Received:
    """Check and act on one delivery (WebhookRefused: nothing was written)."""
    payload = github_check(body=body, signature=signature, event=event, delivery_id=delivery_id)
    try:
        with transaction.atomic():
            received = _act(event, payload, delivery_id)
            # Last, in the same transaction: a replay (or the same delivery twice at once)
            # fails on the unique id and rolls back whatever its actions filed.
            GithubDelivery.objects.create(
                delivery_id=delivery_id,
                event=event,
                action=str(payload.get("action") or "")[:50],
                outcome=received.outcome[:300],
                quantum_id=received.quantum_id,
            )
    except IntegrityError:
        if GithubDelivery.objects.filter(delivery_id=delivery_id).exists():
            raise WebhookRefused(
                409, "Delivery replayed", f"delivery {delivery_id} was received already"
            ) from None
        raise
    except QuantaError as exc:
        raise WebhookRefused(422, "Cannot file a quantum", str(exc)) from None
    logger.info("github %s %s: %s", event, delivery_id, received.outcome,
                extra={"delivery_id": delivery_id, "quantum_id": received.quantum_id})  # fmt: skip
    return received


def _word(value: Any) -> str:
    """A short string field (an action, a conclusion) as given, or "" when it is not a string:
    compared with known values, never hashed or printed whole."""
    return value[:50] if isinstance(value, str) else ""


def _where(path: str) -> str:
    return (path if len(path) <= 100 else path[:99] + "…") or "the body"


def _base_branch() -> str:
    if settings.HOOKS_GITHUB_BASE_BRANCH:
        return str(settings.HOOKS_GITHUB_BASE_BRANCH)
    from tether.services.changes import target_branch

    return target_branch()


def _text(value: Any, limit: int) -> str:
    return redact(value if isinstance(value, str) else "")[:limit]


def _repo(payload: dict[str, Any]) -> str:
    repository = payload.get("repository")
    name = repository.get("full_name") if isinstance(repository, dict) else None
    return name if isinstance(name, str) and name else "unknown"


def _object(payload: dict[str, Any], key: str) -> dict[str, Any]:
    value = payload.get(key)
    if not isinstance(value, dict):
        raise WebhookRefused(400, "Malformed payload", f"`{key}` must be an object")
    return value


def _act(event: str, payload: dict[str, Any], delivery_id: str) -> Received:
    if event == "ping":
        return Received(delivery_id, event, "pong")
    if event in PULL_EVENTS or event == "check_run":
        outcome = github_delivery(event, payload)
        if outcome is not None:
            return Received(delivery_id, event, outcome)
        if event in PULL_EVENTS:
            return Received(delivery_id, event, "ignored: not about one of our pull requests")
    if event == "push":
        return _push(payload, delivery_id)
    if event == "issues":
        return _issue(payload, delivery_id)
    return _ci(event, payload, delivery_id)


def _push(payload: dict[str, Any], delivery_id: str) -> Received:
    ref = payload.get("ref")
    if not isinstance(ref, str):
        raise WebhookRefused(400, "Malformed payload", "`ref` must be a string")
    base = _base_branch()
    if ref != f"refs/heads/{base}":
        return Received(delivery_id, "push", f"ignored: a push to {ref[:100]}, not {base}")
    transaction.on_commit(lambda: app.send_task(WAKE_TASK))
    return Received(delivery_id, "push", f"a push to {base}: the scheduler woken")


def _ci(event: str, payload: dict[str, Any], delivery_id: str) -> Received:
    run = _object(payload, event)
    action, conclusion = _word(payload.get("action")), _word(run.get("conclusion"))
    if event == "check_run":
        suite = run.get("check_suite")
        branch = suite.get("head_branch") if isinstance(suite, dict) else None
    else:
        branch = run.get("head_branch")
    name = _text(run.get("name"), 100) or event
    base = _base_branch()
    if action != "completed" or conclusion not in FAILED:
        return Received(delivery_id, event, f"ignored: {name} {action} ({conclusion})")
    if branch != base:
        return Received(delivery_id, event, f"ignored: {name} failed on {branch}, not {base}")
    repo = _repo(payload)
    url = _text(run.get("html_url") or run.get("details_url"), 500)
    output = run.get("output")
    summary = _text(output.get("summary") if isinstance(output, dict) else "", BODY_QUOTE)
    sha = _text(run.get("head_sha"), 40)
    kind = "check run" if event == "check_run" else "workflow"
    key = f"ci:{repo}:{name}"[:300]

    def file() -> Quantum:
        return quantum_create(
            title=f"Heal {base}: the {kind} {name} failed ({conclusion})"[:500],
            body=(
                f"GitHub reports that the {kind} `{name}` of {repo} concluded `{conclusion}` on "
                f"`{base}` at {sha[:12] or 'an unknown commit'}. Make it pass again without "
                f"weakening it.\n\n{url}\n\n{summary}"
            ).strip(),
            kind="bug",
            priority=0,
            labels=filed_labels("healing", "healing", "github"),
        )

    quantum, filed = _link(key, file, reopen=True)
    verb = "filed" if filed else "already open:"
    return Received(delivery_id, event, f"{name} failed: healing quantum {verb} #{quantum.pk}",
                    quantum.pk)  # fmt: skip


def _issue(payload: dict[str, Any], delivery_id: str) -> Received:
    issue = _object(payload, "issue")
    action, number = _word(payload.get("action")), issue.get("number")
    if not isinstance(number, int):
        raise WebhookRefused(400, "Malformed payload", "`issue.number` must be an integer")
    labels = issue.get("labels")
    names = {
        label.get("name") for label in labels or []
        if isinstance(label, dict) and isinstance(label.get("name"), str)
    } if isinstance(labels, list) else set()  # fmt: skip
    wanted = settings.HOOKS_GITHUB_ISSUE_LABEL
    if action not in ISSUE_ACTIONS or wanted not in names:
        return Received(delivery_id, "issues", f"ignored: issue #{number} {action}")
    repo = _repo(payload)
    title = _text(issue.get("title"), 450).strip() or f"GitHub issue #{number}"
    url = _text(issue.get("html_url"), 500)

    def file() -> Quantum:
        return quantum_create(
            title=f"{title} (#{number})",
            body=f"{url}\n\n{_text(issue.get('body'), 50_000)}".strip(),
            labels=["github"],
        )

    quantum, filed = _link(f"issue:{repo}#{number}"[:300], file, reopen=False)
    verb = "became" if filed else "is already"
    return Received(delivery_id, "issues", f"issue #{number} {verb} quantum #{quantum.pk}",
                    quantum.pk)  # fmt: skip


def _link(key: str, file: Any, *, reopen: bool) -> tuple[Quantum, bool]:
    """The quantum linked to `key`, or a new one filed by `file()`; with `reopen`, a closed one
    is replaced by a new one. (quantum, whether it was filed now)."""
    link = GithubLink.objects.select_for_update().select_related("quantum").filter(key=key).first()
    if link is not None:
        if not reopen or link.quantum.status != QuantumStatus.CLOSED:
            return link.quantum, False
        quantum = file()
        GithubLink.objects.filter(pk=link.pk).update(quantum=quantum)
        return quantum, True
    # A savepoint: another delivery filing for the same key at once wins the unique key, and
    # this one's quantum is rolled back with its link.
    try:
        with transaction.atomic():
            quantum = file()
            GithubLink.objects.create(key=key, quantum=quantum)
    except IntegrityError:
        return GithubLink.objects.select_related("quantum").get(key=key).quantum, False
    return quantum, True
