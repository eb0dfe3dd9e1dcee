"""Two repositories run waves at once on a real worker: each quantum's branch, worktree, review
and merge stay in its own repository, and each repository's merge queue runs its own checks."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bursts.services import wave_start
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.services import quantum_create
from repos.services import repository_create, repository_default
from tests.bursts.conftest import pipeline, wait_wave
from tests.polling import wait_for
from tether.models import ChangeReview, ChangeStatus
from tether.services import change_approve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WRITER = """
name: write-{name}
match: {{roles: [coder]}}
turns:
  - text: "Writing {name}.txt."
    tools:
      - write_file: {{path: "{name}.txt", content: "from {name}\\n"}}
  - text: "{name}.txt written."
"""


def branches(repo: Path) -> set[str]:
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname:short)", "refs/heads"],
        cwd=repo, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return set(out.split())


def on_main(repo: Path, name: str) -> str | None:
    proc = subprocess.run(
        ["git", "show", f"main:{name}"], cwd=repo, capture_output=True, text=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def test_two_repositories_run_waves_at_once_apart(
    tether_worker: Any, repo: Path, scripts: Callable[[str, str], None], tmp_path: Path
) -> None:
    second_path = demo_repo_ensure(tmp_path / "second")
    second = repository_create(
        name="second",
        location=str(second_path),
        target_branch="main",
        # The second repository's own check: it passes only on its own merged result.
        verify_commands=["test -f b.txt", "test ! -e a.txt"],
        inspect=repository_inspect,
    )
    default = repository_default()
    for name in ("a", "b"):
        scripts(f"write-{name}", WRITER.format(name=name))
    pipeline("both", ("sequential", ["coder"]), labels=["both"])
    qa = quantum_create(title="in the default repository", labels=["both", "script:write-a"])
    qb = quantum_create(
        title="in the second repository", labels=["both", "script:write-b"],
        repository_id=second.pk,
    )  # fmt: skip

    wave_a = wave_start(labels=["both"])
    wave_b = wave_start(labels=["both"], repository_id=second.pk)

    assert (wave_a.repository_id, wave_b.repository_id) == (default.pk, second.pk)
    assert wait_wave(wave_a.pk, timeout=90).status == "done"
    assert wait_wave(wave_b.pk, timeout=90).status == "done"
    # Each wave ran its own repository's quantum only.
    assert list(wave_a.runs.values_list("quantum_id", flat=True)) == [qa.pk]
    assert list(wave_b.runs.values_list("quantum_id", flat=True)) == [qb.pk]
    # Branches (and the worktrees they were made in) are each repository's own.
    assert branch_for(qa.pk) in branches(repo) and branch_for(qb.pk) not in branches(repo)
    assert branch_for(qb.pk) in branches(second_path)
    assert branch_for(qa.pk) not in branches(second_path)

    reviews: dict[int, ChangeReview] = {}
    for q in (qa, qb):
        found = ChangeReview.objects.filter(quantum=q)
        reviews[q.pk] = wait_for(found.first, what=f"a review of #{q.pk}")
    assert [f["path"] for f in reviews[qa.pk].files] == ["a.txt"]
    assert [f["path"] for f in reviews[qb.pk].files] == ["b.txt"]
    assert reviews[qb.pk].base == "main"

    for review in reviews.values():
        change_approve(change_id=review.pk)  # the worker's queue merges each in its repository

    ids = [r.pk for r in reviews.values()]
    wait_for(
        lambda: (
            not ChangeReview.objects.filter(
                pk__in=ids, status__in=[ChangeStatus.QUEUED, ChangeStatus.MERGING]
            ).exists()
        ),
        timeout=60,
        what="both merge queues to take their change",
    )
    outcomes = list(ChangeReview.objects.filter(pk__in=ids).values("status", "comment", "checks"))
    assert [o["status"] for o in outcomes] == [ChangeStatus.MERGED] * 2, outcomes
    assert on_main(repo, "a.txt") == "from a\n" and on_main(repo, "b.txt") is None
    assert on_main(second_path, "b.txt") == "from b\n" and on_main(second_path, "a.txt") is None
    checks = ChangeReview.objects.get(pk=reviews[qb.pk].pk).checks
    assert any("test -f b.txt" in str(check) for check in checks), checks
    queues = sorted(p.name for p in (tmp_path / "home" / "merges").iterdir())
    assert len(queues) == 2 and all(q.startswith("queue-") for q in queues)
