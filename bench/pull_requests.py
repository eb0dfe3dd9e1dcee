"""Pull requests: our overhead per pull request beyond the forge's own latency.

`--changes` quanta each leave a commit; each is reviewed, then published (push of its branch,
the pull request opened, labelled) on a local fake of GitHub's REST API (tests/fakes) that
answers every request after `--latency-ms`, as GitHub's own round trips would take. Then each
pull request is approved with a green check and looked at again (the sync that queues it).
Printed per pull request: wall time of publishing and of the sync, the forge's share (the time
the fake spent answering, its latency included; the push to its bare repository is local git,
counted as ours), and our overhead (the rest: the client, our queries, redaction, events, the
push); target under 500 ms beyond the forge's own latency.

    .venv/bin/python bench/pull_requests.py [--changes 30] [--latency-ms 50]   (needs the services)

Uses a database of its own (annihilation_bench_pulls, emptied first) and a temporary
ANNIHILATION_HOME; the publisher runs in this process (the body of its Celery task).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, ms, pct, scratch_dir  # noqa: E402

if TYPE_CHECKING:
    from tests.fakes.github_server import FakeGitHub

HOME = scratch_dir("annihilation-bench-pulls-")
os.environ.update(
    ANNIHILATION_HOME=str(HOME),
    ANNIHILATION_REPO=str(HOME / "repo"),
    ANNIHILATION_TETHER_AUTO_MERGE_LOW_RISK="false",
    BENCH_GITHUB_TOKEN="github_pat_" + "B" * 82,
    LOG_LEVEL="WARNING",
    # Our pacing of forge calls is a limit, not an overhead: out of the way here.
    ANNIHILATION_FORGES_RATE_CAPACITY="100000",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()
    django_bench_db("annihilation_bench_pulls")

    from bursts.models import Burst, QuantumRun, RunStatus, Wave
    from forges.models import PullRequest
    from forges.services import forge_configure, pull_request_publish, pull_request_sync
    from psychonauts.workspaces.repository import branch_for
    from psychonauts.workspaces.worktrees import (
        demo_repo_ensure,
        workspace_commit,
        workspace_ensure,
    )
    from quanta.services import quantum_create
    from repos.services import repository_default
    from tests.fakes.github_server import github_served
    from tether.models import ChangeReview, ChangeStatus
    from tether.services import change_review_create

    repo = demo_repo_ensure(HOME / "repo")
    bare = HOME / "forge.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(repo), str(bare)], check=True)
    with github_served(bare, latency_s=args.latency_ms / 1000) as fake:
        forge_configure(
            repository_id=repository_default().pk, slug=fake.slug,
            token_env="BENCH_GITHUB_TOKEN", api_url=fake.url, push_url=str(bare),
        )  # fmt: skip
        wave = Wave.objects.create(status="done")
        burst = Burst.objects.create(wave=wave, number=1, phase="done")
        pulls: list[int] = []
        for n in range(args.changes):
            quantum = quantum_create(title=f"Change {n}")
            run = QuantumRun.objects.create(
                wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE,
                branch=branch_for(quantum.pk),
            )  # fmt: skip
            tree = workspace_ensure(quantum_id=quantum.pk)
            (tree / f"change_{n}.py").write_text(f"VALUE = {n}\n")
            workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="b", role="coder")
            review = change_review_create(quantum_run_id=run.pk)
            assert review is not None
            pulls.append(PullRequest.objects.get(change=review).pk)

        publish = _timed(fake, lambda pull_id: pull_request_publish(pull_id=pull_id), pulls)
        for pull in PullRequest.objects.filter(pk__in=pulls):
            assert pull.number is not None
            fake.check(pull.head_sha, "tests", "success")
            fake.review(pull.number, "APPROVED")
        if os.environ.get("BENCH_PROFILE"):
            import cProfile

            cProfile.runctx(
                "pull_request_sync(pull_id=pulls[0])", globals(), locals(), sort="cumtime"
            )
        sync = _timed(fake, lambda pull_id: pull_request_sync(pull_id=pull_id), pulls)
        queued = ChangeReview.objects.filter(
            pull_requests__pk__in=pulls, status=ChangeStatus.QUEUED
        ).count()

    print(f"pull requests: {args.changes}, forge latency {args.latency_ms:.0f} ms per request")
    for name, (walls, requests, forge) in (("publish", publish), ("sync", sync)):
        ours = [w - f for w, f in zip(walls, forge, strict=True)]
        print(
            f"{name:8s} wall p50 {ms(pct(walls, 50))}  forge requests {sum(requests) / len(requests):.1f} "
            f"({ms(pct(forge, 50))})  our overhead p50 {ms(pct(ours, 50))} p95 {ms(pct(ours, 95))} "
            f"max {ms(max(ours))}"
        )
    print(f"open on the forge: {len(fake.open_pulls())}; changes queued after approval: {queued}")


def _timed(
    fake: FakeGitHub, call: Callable[[int], object], ids: list[int]
) -> tuple[list[float], list[int], list[float]]:
    """Per id: wall time, requests to the forge, and the forge's own time answering them."""
    walls: list[float] = []
    counts: list[int] = []
    served: list[float] = []
    for pull_id in ids:
        before, before_s = len(fake.requests), fake.served_s
        started = time.perf_counter()
        call(pull_id)
        walls.append(time.perf_counter() - started)
        counts.append(len(fake.requests) - before)
        served.append(fake.served_s - before_s)
    return walls, counts, served


if __name__ == "__main__":
    main()
