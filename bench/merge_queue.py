"""The merge queue: 100 approved low-risk changes on a 1,000-file repository, each verified on
its merged result by a 1-second command (`sleep 1`, through the guard and the sandbox).

Prints changes per minute, the queue's time per change beyond the verify command (target under
300 ms) and, measured in the same run, the baseline: a bare `git merge --no-ff` plus the same
command run directly, per change. Checks the target moved 100 times and nothing was lost.

    python bench/merge_queue.py [--changes 100] [--files 1000]

The consumer runs in this process (`merge_queue_run`, the body of the `tether.merge_queue_run`
task): what is measured is the queue, not Celery's dispatch. Uses the dev services with a
database of its own (annihilation_bench, migrated and emptied) and a temporary ANNIHILATION_HOME.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, scratch_dir  # noqa: E402

HOME = scratch_dir("annihilation-bench-merge-")
REPO = HOME / "repo"
os.environ.update(
    ANNIHILATION_HOME=str(HOME),
    ANNIHILATION_REPO=str(REPO),
    ANNIHILATION_TETHER_AUTO_MERGE_LOW_RISK="false",
    ANNIHILATION_TETHER_VERIFY_COMMANDS="sleep 1",
)


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    django_bench_db("annihilation_bench_merge")
    import django

    django.setup()
    from bursts.models import Burst, QuantumRun, RunStatus, Wave
    from psychonauts.workspaces.repository import branch_for
    from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
    from quanta.services import quantum_create
    from tether.models import ChangeReview, ChangeStatus
    from tether.services import change_review_create, changes_approve_low_risk
    from tether.services.merge_queue import merge_queue_run

    REPO.mkdir()
    sh("init", "-q", "-b", "main", cwd=REPO)
    for n in range(args.files):
        folder = REPO / f"pkg{n % 20}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{n}.py").write_text(f"VALUE_{n} = {n}\n")
    sh("add", "-A", cwd=REPO)
    sh("-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "base", cwd=REPO)
    wave = Wave.objects.create(status="done")
    burst = Burst.objects.create(wave=wave, number=1, phase="done")
    for n in range(args.changes):
        quantum = quantum_create(title=f"change {n}")
        tree = workspace_ensure(quantum_id=quantum.pk)
        (tree / "notes").mkdir(exist_ok=True)
        (tree / "notes" / f"c{n}.md").write_text(f"change {n}\n")
        workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="b", role="coder")
        run = QuantumRun.objects.create(
            wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE,
            branch=branch_for(quantum.pk),
        )  # fmt: skip
        change_review_create(quantum_run_id=run.pk)
    changes_approve_low_risk(by="bench")
    before = sh("rev-parse", "main", cwd=REPO)

    started = time.monotonic()
    report = merge_queue_run()
    elapsed = time.monotonic() - started

    merged = ChangeReview.objects.filter(status=ChangeStatus.MERGED).count()
    moves = int(sh("rev-list", "--count", "--first-parent", f"{before}..main", cwd=REPO))
    verify_s = [
        check["elapsed_s"]
        for checks in ChangeReview.objects.values_list("checks", flat=True)
        for check in checks
    ]
    # Baseline: the bare merge and the bare command, in a worktree of its own, per change.
    bare = HOME / "bare"
    sh("worktree", "add", "-q", "--detach", str(bare), before, cwd=REPO)
    branches = [branch_for(q) for q in ChangeReview.objects.values_list("quantum_id", flat=True)]
    t0 = time.monotonic()
    for branch in branches:
        sh("-c", "user.name=b", "-c", "user.email=b@b", "merge", "--no-ff", "-q", "--no-edit",
           branch, cwd=bare)  # fmt: skip
        subprocess.run(["sleep", "1"], cwd=bare, check=True)
    baseline = (time.monotonic() - t0) / len(branches)
    per_change = elapsed / max(merged, 1)
    mean_verify = sum(verify_s) / max(len(verify_s), 1)
    print(f"changes: {args.changes} on {args.files} files; merged {merged}, lost "
          f"{args.changes - merged - len(report.conflicted) - len(report.failed)}; "
          f"target moved {moves} times")  # fmt: skip
    print(f"queue: {elapsed:.1f}s, {merged / elapsed * 60:.1f} changes/min, "
          f"{per_change * 1000:.0f} ms per change")  # fmt: skip
    print(f"verify command (sandboxed `sleep 1`): {mean_verify * 1000:.0f} ms mean")
    print(f"queue overhead beyond the verify command: {(per_change - mean_verify) * 1000:.0f} ms "
          "per change (target < 300 ms)")  # fmt: skip
    print(f"baseline (bare git merge + `sleep 1`): {baseline * 1000:.0f} ms per change; "
          f"queue minus baseline: {(per_change - baseline) * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
