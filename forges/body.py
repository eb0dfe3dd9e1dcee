"""The pull request's title and body: what a reviewer on the forge needs from the change review
(quantum, goal, risk tier and reasons, checks run, the drifts the work rests on, files left out),
redacted like every other writer's text."""

from __future__ import annotations

from django.conf import settings

from autopilot.models import Goal
from core.redaction import redact
from psychonauts.models import Verification
from quanta.models import Quantum
from tether.models import ChangeReview, Drift

BODY_LIMIT = 60_000  # GitHub refuses bodies over 65,536 characters
MARKER = "<!-- annihilation:change -->"


def _link(path: str) -> str:
    base = str(settings.FORGES_LINK_BASE).rstrip("/")
    return f"{base}{path}" if base else path


def pull_title(review: ChangeReview, quantum: Quantum) -> str:
    return redact(f"{quantum.title} (#{quantum.pk})")[:250]


def pull_body(review: ChangeReview, quantum: Quantum) -> str:
    lines = [
        MARKER,
        f"**Quantum** [#{quantum.pk}]({_link(f'/quanta/{quantum.pk}/')}): {quantum.title}",
    ]
    goal = Goal.objects.filter(epic_id=quantum.parent_id).only("pk", "title").first()
    if quantum.parent_id and goal is not None:
        lines.append(f"**Goal** [#{goal.pk}]({_link(f'/goals/{goal.pk}/')}): {goal.title}")
    lines.append(f"**Change review** [#{review.pk}]({_link(f'/grounding/changes/{review.pk}/')})")
    lines += ["", f"### Risk: {review.risk}"]
    lines += [f"- {reason}" for reason in review.reasons] or ["- no rule raised the risk"]
    if quantum.body.strip():
        lines += ["", "### What was asked", "", quantum.body.strip()[:5_000]]
    lines += ["", "### Checks run"]
    rounds = list(
        Verification.objects.filter(quantum_id=quantum.pk, commit_sha=review.head_sha)
        .order_by("-created_at")
        .values_list("checks", flat=True)[:1]
    )
    checks = rounds[0] if rounds else []
    if checks:
        for check in checks:
            mark = "passed" if check.get("passed") else f"failed ({check.get('reason', '')})"
            lines.append(f"- `{check.get('command', '')}`: {mark}")
    else:
        lines.append("- none on this commit")
    drifts = list(
        Drift.objects.filter(quantum_id=quantum.pk)
        .order_by("pk")
        .values("pk", "assumption", "status")
    )
    if drifts:
        lines += ["", "### Assumptions this work rests on (drifts)"]
        for drift in drifts:
            anchor = _link(f"/grounding/#drift-{drift['pk']}")
            lines.append(
                f"- [drift #{drift['pk']}]({anchor}) ({drift['status']}): "
                f"{drift['assumption'][:500]}"
            )
    lines += ["", f"### Files: +{review.additions} -{review.deletions}"]
    lines += [f"- `{f['path']}` ({f['status']})" for f in review.files[:100]]
    if len(review.files) > 100:
        lines.append(f"- … and {len(review.files) - 100} more")
    if review.left_out:
        lines += ["", "### Files left out of the commit"]
        lines += [f"- `{path}`" for path in review.left_out[:100]]
    lines += ["", f"Head `{review.head_sha[:12]}` into `{review.base}`."]
    text = redact("\n".join(lines))
    return text if len(text) <= BODY_LIMIT else text[:BODY_LIMIT] + "\n\n… (cut)"


def risk_labels(review: ChangeReview) -> list[str]:
    return [f"risk:{review.risk}"]
