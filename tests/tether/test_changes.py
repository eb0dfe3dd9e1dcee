"""Grounding of code changes on a real git repository: review, risk, approve, reject, conflict,
a branch that moved or vanished, auto-merge; and a whole wave whose agent asks the Tether."""

from __future__ import annotations

import subprocess
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from bursts.models import AgentRun, Burst, QuantumRun, RunStatus, Wave
from bursts.services import wave_start
from core.models import Event
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.models import Quantum
from tests.bursts.conftest import pipeline, wait_wave
from tests.polling import wait_for
from tests.worktrees import worktree_being_added
from tether.errors import AlreadyDecided, BranchMoved
from tether.models import ChangeReview, ChangeStatus, Reaching, ReviewDue
from tether.selectors import change_detail, changes_list
from tether.services import (
    change_approve,
    change_reject,
    change_review_create,
    reaching_answer,
    reviews_due,
    reviews_resend_due,
)
from tether.services.drained import runs_drained
from tether.services.merge_queue import merge_queue_run

FAKE_KEY = "sk-ant-api03-" + "Q" * 40


def finished_run(quantum: Quantum, files: dict[str, str | None]) -> QuantumRun:
    """A done run of the quantum whose agent committed `files` (None deletes) on its branch."""
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    run = QuantumRun.objects.create(
        wave=wave,
        burst=burst,
        quantum=quantum,
        status=RunStatus.DONE,
        branch=branch_for(quantum.pk),
    )
    tree = workspace_ensure(quantum_id=quantum.pk)
    for name, text in files.items():
        path = tree / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="test", role="coder")
    return run


def main_file(repo: Path, name: str) -> str | None:
    proc = subprocess.run(
        ["git", "show", f"main:{name}"], cwd=repo, capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def test_it_reviews_a_change_and_merges_it_on_approve(db, repo, make_quantum, tether_settings):
    quantum = make_quantum()
    run = finished_run(quantum, {"hello.py": "print('hi')\n"})

    review = change_review_create(quantum_run_id=run.pk)

    assert review is not None and review.status == ChangeStatus.PENDING
    assert (review.base, review.risk, review.additions, review.deletions) == ("main", "low", 1, 0)
    assert [f["path"] for f in review.files] == ["hello.py"]
    assert change_review_create(quantum_run_id=run.pk) == review  # once per run
    detail = change_detail(change_id=review.pk)
    assert detail.files[0].diff.startswith("diff --git a/hello.py b/hello.py")

    assert change_approve(change_id=review.pk).status == ChangeStatus.QUEUED
    merge_queue_run()
    merged = ChangeReview.objects.get(pk=review.pk)

    assert merged.status == ChangeStatus.MERGED and merged.merge_sha
    assert main_file(repo, "hello.py") == "print('hi')\n"
    with pytest.raises(AlreadyDecided):
        change_approve(change_id=review.pk)


def test_a_drained_done_run_is_due_for_review_until_its_branch_is_reviewed(
    db, repo, make_quantum, tether_settings, django_capture_on_commit_callbacks
):
    changed = finished_run(make_quantum(), {"hello.py": "print('hi')\n"})
    unchanged = QuantumRun.objects.create(
        wave=changed.wave, burst=changed.burst, quantum=make_quantum(), status=RunStatus.DONE
    )
    failed = QuantumRun.objects.create(
        wave=changed.wave, burst=changed.burst, quantum=make_quantum(), status=RunStatus.ERROR
    )

    with django_capture_on_commit_callbacks() as sent:
        runs_drained([(changed, "done"), (unchanged, "done"), (failed, "reopened")])
        runs_drained([(changed, "done")])  # drained twice: still due once

    assert len(sent) == 2  # the review tasks go to the broker once the drain commits
    due = dict(ReviewDue.objects.values_list("quantum_run_id", "quantum_id"))
    assert due == {changed.pk: changed.quantum_id, unchanged.pk: unchanged.quantum_id}
    assert change_review_create(quantum_run_id=changed.pk) is not None
    assert change_review_create(quantum_run_id=unchanged.pk) is None  # no branch: no change
    assert not ReviewDue.objects.exists()


def test_the_sweep_sends_a_review_due_too_long_again_once_per_period(
    db, make_quantum, settings, django_capture_on_commit_callbacks
):
    settings.TETHER_REVIEW_RESEND_S = 60
    wave = Wave.objects.create(status="running")
    burst = Burst.objects.create(wave=wave, number=1, phase="running")
    runs = [
        QuantumRun.objects.create(
            wave=wave, burst=burst, quantum=make_quantum(), status=RunStatus.DONE
        )
        for _ in range(3)
    ]
    reviews_due(runs=[(r.pk, r.quantum_id) for r in runs])
    assert reviews_resend_due() == []  # just sent
    lost = [runs[0].pk, runs[2].pk]
    ReviewDue.objects.filter(quantum_run_id__in=lost).update(
        sent_at=timezone.now() - timedelta(minutes=5)
    )

    with django_capture_on_commit_callbacks() as sent:
        assert reviews_resend_due() == lost

    assert len(sent) == 1
    assert reviews_resend_due() == []  # their clock restarted: not sent again this period
    assert ReviewDue.objects.count() == 3  # still due until the reviews are made


def test_an_approve_waits_for_a_worktree_being_added(
    transactional_db, repo, make_quantum, tether_settings
):
    """A merge lists the worktrees, and `git worktree list` fails on the half-written record of
    one that an agent is adding: the merge waits until no add is running."""
    run = finished_run(make_quantum(), {"hello.py": "print('hi')\n"})
    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None
    outcome: list[ChangeReview] = []

    def approve() -> None:
        try:
            change_approve(change_id=review.pk)
            merge_queue_run()
            outcome.append(ChangeReview.objects.get(pk=review.pk))
        finally:
            connection.close()

    with worktree_being_added(repo):
        approving = threading.Thread(target=approve)
        approving.start()
        approving.join(1.0)
        assert approving.is_alive() and not outcome
    approving.join(10)
    assert outcome and outcome[0].status == ChangeStatus.MERGED
    assert main_file(repo, "hello.py") == "print('hi')\n"


def test_it_reopens_the_quantum_with_the_reason_on_reject(db, repo, make_quantum, tether_settings):
    quantum = make_quantum()
    Quantum.objects.filter(pk=quantum.pk).update(status="closed")
    review = change_review_create(quantum_run_id=finished_run(quantum, {"a.txt": "a\n"}).pk)
    assert review is not None
    head_before = git("rev-parse", "main", cwd=repo)

    rejected = change_reject(change_id=review.pk, reason="use the existing helper")

    assert rejected.status == ChangeStatus.REJECTED
    quantum.refresh_from_db()
    assert quantum.status == "open"
    assert quantum.comments.filter(body__contains="use the existing helper").exists()
    assert git("rev-parse", "main", cwd=repo) == head_before


def test_it_aborts_a_conflicting_merge_and_files_a_correction(
    db, repo, make_quantum, tether_settings
):
    first, second = make_quantum("first"), make_quantum("second")
    a = change_review_create(quantum_run_id=finished_run(first, {"calc.py": "A = 1\n"}).pk)
    b = change_review_create(quantum_run_id=finished_run(second, {"calc.py": "B = 2\n"}).pk)
    assert a is not None and b is not None
    change_approve(change_id=a.pk)
    merge_queue_run()
    head = git("rev-parse", "main", cwd=repo)

    change_approve(change_id=b.pk)
    merge_queue_run()
    conflicted = ChangeReview.objects.get(pk=b.pk)

    assert conflicted.status == ChangeStatus.CONFLICTED
    assert "calc.py" in conflicted.comment
    correction = Quantum.objects.get(pk=conflicted.correction_id or 0)
    assert correction.kind == "correction" and "calc.py" in correction.body
    assert git("rev-parse", "main", cwd=repo) == head
    assert git("status", "--porcelain", cwd=repo) == ""  # no merge left half done
    assert main_file(repo, "calc.py") == "A = 1\n"


def test_it_refuses_a_change_whose_branch_moved_or_vanished(
    db, repo, make_quantum, tether_settings
):
    quantum = make_quantum()
    review = change_review_create(quantum_run_id=finished_run(quantum, {"x.txt": "1\n"}).pk)
    assert review is not None
    tree = workspace_ensure(quantum_id=quantum.pk)
    (tree / "x.txt").write_text("2\n")
    workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="late", role="coder")
    head = git("rev-parse", "main", cwd=repo)

    with pytest.raises(BranchMoved, match="moved"):
        change_approve(change_id=review.pk)

    git("worktree", "remove", "--force", str(tree), cwd=repo)
    git("branch", "-D", branch_for(quantum.pk), cwd=repo)
    with pytest.raises(BranchMoved, match="deleted"):
        change_approve(change_id=review.pk)
    review.refresh_from_db()
    assert review.status == ChangeStatus.PENDING
    assert git("rev-parse", "main", cwd=repo) == head


def test_it_rates_a_leaked_secret_high_and_never_stores_it(db, repo, make_quantum, tether_settings):
    quantum = make_quantum()
    run = finished_run(
        quantum,
        {"config/keys.py": f'ANTHROPIC_KEY = "{FAKE_KEY}"\n', "README.md": None},
    )

    review = change_review_create(quantum_run_id=run.pk)

    assert review is not None and review.risk == "high"
    assert FAKE_KEY not in review.diff and "sk-ant-…(redacted)" in review.diff
    assert any("secret" in r for r in review.reasons)
    assert any("deletes README.md" in r for r in review.reasons)
    assert FAKE_KEY not in str(review.reasons)
    assert not Event.objects.filter(payload__icontains=FAKE_KEY).exists()
    assert FAKE_KEY not in str(Event.objects.filter(topic="tether:drifts").values("payload"))


def test_it_merges_low_risk_changes_itself_when_allowed(db, repo, make_quantum, tether_settings):
    tether_settings.TETHER_AUTO_MERGE_LOW_RISK = True
    low = change_review_create(
        quantum_run_id=finished_run(make_quantum("low"), {"notes/a.md": "a\n"}).pk
    )
    medium = change_review_create(
        quantum_run_id=finished_run(make_quantum("medium"), {"requirements.txt": "x\n"}).pk
    )
    assert low is not None and medium is not None
    assert (low.status, low.decided_by) == (ChangeStatus.QUEUED, "auto (low risk)")
    merge_queue_run()
    low.refresh_from_db()
    assert (low.status, low.decided_by) == (ChangeStatus.MERGED, "auto (low risk)")
    assert (medium.risk, medium.status) == ("medium", ChangeStatus.PENDING)
    assert next(c.pk for c in changes_list()) == medium.pk  # pending first


def test_it_asks_the_operator_about_a_quarantined_quantum(db, make_quantum):
    quantum = make_quantum()
    wave = Wave.objects.create(status="running")
    burst = Burst.objects.create(wave=wave, number=1)
    run = None
    for n in range(3):
        run = QuantumRun.objects.create(
            wave=wave, burst=burst if n == 0 else Burst.objects.create(wave=wave, number=n + 1),
            quantum=quantum, status=RunStatus.ERROR, error_reason=f"boom {n}",
        )  # fmt: skip
    assert run is not None

    runs_drained([(run, "blocked")])
    runs_drained([(run, "blocked")])  # drained twice: still one question

    reaching = Reaching.objects.get(quantum=quantum)
    assert reaching.agent_run_id is None and reaching.priority == "high"
    assert "failed 3 times" in reaching.question
    assert "boom 0" in reaching.context and "boom 2" in reaching.context
    Quantum.objects.filter(pk=quantum.pk).update(status="blocked")

    result = reaching_answer(reaching_id=reaching.pk, text="retry")

    assert result.kind == "quarantine"
    quantum.refresh_from_db()
    assert quantum.status == "open"


@pytest.mark.django_db(transaction=True)
def test_it_resumes_a_pipeline_agent_and_reviews_what_it_committed(
    tether_worker: Any, repo: Path, make_quantum: Any
):
    pipeline("solo", ("sequential", ["coder", "tester"]), labels=["solo"])
    quantum = make_quantum(labels=["solo", "ask"])
    wave = wave_start(labels=["solo"])
    reaching = wait_for(
        lambda: Reaching.objects.filter(quantum=quantum, status="pending").first(),
        what="the coder's question",
    )

    reaching_answer(reaching_id=reaching.pk, text="keep it")

    assert wait_wave(wave.pk).status == "done"
    # The chain went on after the coder: the tester's link was sent with the resumed coder.
    assert AgentRun.objects.get(quantum=quantum, role="tester").status == "done"
    review = wait_for(
        lambda: ChangeReview.objects.filter(quantum=quantum).first(), what="the change review"
    )
    assert [f["path"] for f in review.files] == [f"notes/decision-q{quantum.pk}.md"]
    change_approve(change_id=review.pk)  # the worker's queue merges it
    wait_for(
        lambda: main_file(repo, f"notes/decision-q{quantum.pk}.md") is not None,
        what="the merge queue to merge the change",
    )


@pytest.mark.django_db(transaction=True)
def test_it_resumes_a_fan_out_agent_alone_and_the_stage_completes(
    tether_worker: Any, make_quantum: Any
):
    pipeline("fan", ("fan_out", ["coder", "reviewer"]), labels=["fan"])
    quantum = make_quantum(labels=["fan", "ask"])
    wave = wave_start(labels=["fan"])
    reaching = wait_for(
        lambda: Reaching.objects.filter(quantum=quantum, status="pending").first(),
        what="the coder's question",
    )
    wait_for(
        lambda: AgentRun.objects.filter(quantum=quantum, role="reviewer", status="done").exists(),
        what="the reviewer to finish beside the waiting coder",
    )

    reaching_answer(reaching_id=reaching.pk, text="keep it")

    assert wait_wave(wave.pk).status == "done"
    assert QuantumRun.objects.get(quantum=quantum).status == RunStatus.DONE
    assert AgentRun.objects.filter(quantum=quantum).count() == 2  # no agent ran twice
