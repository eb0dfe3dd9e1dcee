"""The merge queue on a real git repository: approved changes merged one at a time onto the
current target, verified on the merged result (through the guard and the sandbox), the target
moved by compare-and-set; conflicts and failed checks move nothing and go back to the quantum."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection

from psychonauts.workspaces.git import git
from quanta.models import Quantum
from tests.bursts.conftest import Worker, worker_env
from tests.polling import wait_for
from tests.tether.test_changes import finished_run, main_file
from tether.errors import AlreadyDecided
from tether.models import ChangeReview, ChangeStatus
from tether.services import change_approve, change_review_create, changes_approve
from tether.services.changes import change_merge_claim
from tether.services.merge_queue import merge_queue_run

# The target's invariant across files: at most one `extra-*.txt`. Each change below keeps it;
# the two merged together break it.
INVARIANT = "python3 check_extras.py"
CHECK_EXTRAS = "import glob, sys\n\nsys.exit(len(glob.glob('extra-*.txt')) > 1)\n"


def review_of(quantum: Quantum, files: dict[str, str | None]) -> ChangeReview:
    review = change_review_create(quantum_run_id=finished_run(quantum, files).pk)
    assert review is not None
    return review


def first_parents(repo: Path) -> list[str]:
    return git("log", "--first-parent", "--format=%s", "main", cwd=repo).splitlines()


@pytest.fixture
def queue_worker(tether_settings: Any, repo: Path, tmp_path: Path) -> Iterator[Worker]:
    """Two celery workers (4 threads each) on the test's repository: the queue must still merge
    one change at a time. Every merged result is checked by the target's own check."""
    env = worker_env(
        ANNIHILATION_HOME=str(tmp_path / "home"),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_PROVIDER="",
        ANNIHILATION_TETHER_AUTO_MERGE_LOW_RISK="false",
        ANNIHILATION_TETHER_VERIFY_COMMANDS="python3 calc.py",
        REDIS_URL=django_settings.REDIS_URL,
    )
    workers = [
        Worker(env=env, tmp=tmp_path, name=f"queue{n}-{os.getpid()}", beat=n == 0).start()
        for n in range(2)
    ]
    yield workers[0]
    for worker in workers:
        worker.stop()
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_it_merges_twenty_changes_approved_at_once_in_order_each_verified(
    queue_worker: Worker, repo: Path, make_quantum: Any
) -> None:
    reviews = [
        review_of(
            make_quantum(f"file {n}", verify_commands=[f"test -f f{n:02d}.txt"]),
            {f"f{n:02d}.txt": f"{n}\n"},
        )
        for n in range(20)
    ]
    ids = [r.pk for r in reviews]

    outcomes = changes_approve(change_ids=ids, by="op")

    assert all(not isinstance(o, Exception) for _, o in outcomes)
    wait_for(
        lambda: ChangeReview.objects.filter(pk__in=ids, status=ChangeStatus.MERGED).count() == 20,
        what="twenty merges",
        timeout=120,
    )
    merged = {c.pk: c for c in ChangeReview.objects.filter(pk__in=ids)}
    # In approval order, one merge commit each on the target's first-parent line.
    expected = [
        f"Merge {merged[i].branch} (change #{i}, quantum #{merged[i].quantum_id})" for i in ids
    ]
    assert first_parents(repo)[:20] == list(reversed(expected))
    assert git("rev-parse", "main", cwd=repo) == merged[ids[-1]].merge_sha
    for n, change_id in enumerate(ids):
        checks = merged[change_id].checks
        # The quantum's own check (its file exists only in the merged result) and the target's.
        assert [c["command"] for c in checks] == [
            f"test -f f{n:02d}.txt",
            "python3 calc.py",
        ]
        assert all(c["passed"] for c in checks)
    assert git("status", "--porcelain", cwd=repo) == ""  # the main checkout came along
    assert (repo / "f19.txt").read_text() == "19\n"


def test_it_merges_the_first_of_two_conflicting_changes_and_sends_back_the_second(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    first = review_of(make_quantum("first"), {"calc.py": "A = 1\n"})
    second = review_of(make_quantum("second"), {"calc.py": "B = 2\n"})
    changes_approve(change_ids=[first.pk, second.pk])

    report = merge_queue_run()

    assert (report.merged, report.conflicted) == ([first.pk], [second.pk])
    second.refresh_from_db()
    assert second.status == ChangeStatus.CONFLICTED and "calc.py" in second.comment
    correction = Quantum.objects.get(pk=second.correction_id or 0)
    assert "calc.py" in correction.body
    assert main_file(repo, "calc.py") == "A = 1\n"
    assert git("rev-parse", "main", cwd=repo) == ChangeReview.objects.get(pk=first.pk).merge_sha
    assert git("status", "--porcelain", cwd=repo) == ""


def test_it_refuses_a_change_that_passes_alone_but_fails_merged_with_another(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    tether_settings.TETHER_VERIFY_COMMANDS = [INVARIANT]
    (repo / "check_extras.py").write_text(CHECK_EXTRAS)
    git("add", "check_extras.py", cwd=repo)
    git("commit", "-q", "-m", "the extras invariant", cwd=repo)
    first = review_of(make_quantum("one extra"), {"extra-a.txt": "a\n"})
    quantum = make_quantum("another extra")
    second = review_of(quantum, {"extra-b.txt": "b\n"})
    Quantum.objects.filter(pk=quantum.pk).update(status="closed")
    change_approve(change_id=first.pk)
    assert merge_queue_run().merged == [first.pk]
    target = git("rev-parse", "main", cwd=repo)

    change_approve(change_id=second.pk)
    report = merge_queue_run()

    assert report.failed == [second.pk]
    second.refresh_from_db()
    assert second.status == ChangeStatus.FAILED and not second.merge_sha
    assert "exit status 1" in second.comment
    assert second.checks[0]["command"] == INVARIANT and not second.checks[0]["passed"]
    assert git("rev-parse", "main", cwd=repo) == target
    assert main_file(repo, "extra-b.txt") is None
    quantum.refresh_from_db()
    assert quantum.status == "open"
    assert quantum.comments.filter(body__contains="checks failed").exists()


def test_it_kills_a_verify_command_that_hangs_at_its_timeout(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    tether_settings.VERIFY_TIMEOUT_S = 1.0
    review = review_of(make_quantum("hangs", verify_commands=["sleep 60"]), {"h.txt": "h\n"})
    target = git("rev-parse", "main", cwd=repo)
    change_approve(change_id=review.pk)

    merge_queue_run()

    review.refresh_from_db()
    assert review.status == ChangeStatus.FAILED
    assert review.checks[0]["reason"] == "timed out after 1s"
    assert "timed out" in review.comment
    assert git("rev-parse", "main", cwd=repo) == target


def test_it_refuses_a_second_approve_and_returns_a_moved_branch_for_review(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    quantum = make_quantum()
    review = review_of(quantum, {"x.txt": "1\n"})
    change_approve(change_id=review.pk)
    with pytest.raises(AlreadyDecided, match="queued"):
        change_approve(change_id=review.pk)
    target = git("rev-parse", "main", cwd=repo)
    finished_run(quantum, {"x.txt": "2\n"})  # the agent committed again after the review

    report = merge_queue_run()

    assert report.returned == [review.pk]
    review.refresh_from_db()
    assert review.status == ChangeStatus.PENDING and "moved since the review" in review.comment
    assert git("rev-parse", "main", cwd=repo) == target


def test_it_resumes_an_entry_a_dead_consumer_left_merging(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    a = review_of(make_quantum("a"), {"a.txt": "a\n"})
    b = review_of(make_quantum("b"), {"b.txt": "b\n"})
    changes_approve(change_ids=[a.pk, b.pk])
    # A consumer claimed `a` and died before merging it.
    claimed = change_merge_claim()
    assert claimed is not None and claimed.pk == a.pk

    report = merge_queue_run()

    assert report.merged == [a.pk, b.pk]
    assert main_file(repo, "a.txt") == "a\n" and main_file(repo, "b.txt") == "b\n"
    assert len([s for s in first_parents(repo) if s.startswith("Merge")]) == 2


def test_the_cli_approves_every_low_risk_change_and_lists_the_queue(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any
) -> None:
    low = [review_of(make_quantum(f"low {n}"), {f"l{n}.txt": "x\n"}) for n in range(2)]
    medium = review_of(make_quantum("medium"), {"requirements.txt": "x\n"})
    out = StringIO()

    call_command("tether", "approve", "--all-low-risk", stdout=out)

    assert [c.status for c in ChangeReview.objects.filter(pk__in=[r.pk for r in low])] == [
        ChangeStatus.QUEUED
    ] * 2
    queue = StringIO()
    call_command("tether", "queue", "--json", stdout=queue)
    assert [row["id"] for row in json.loads(queue.getvalue())] == [r.pk for r in low]
    with pytest.raises(CommandError, match="is queued"):
        call_command("tether", "approve", str(low[0].pk), str(medium.pk), stdout=StringIO())
    assert ChangeReview.objects.get(pk=medium.pk).status == ChangeStatus.QUEUED
    merge_queue_run()
    shown = StringIO()
    call_command("tether", "show-change", str(low[0].pk), stdout=shown)
    assert "merged as" in shown.getvalue()
    empty = StringIO()
    call_command("tether", "queue", stdout=empty)
    assert "empty" in empty.getvalue()
