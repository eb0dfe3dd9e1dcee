"""What a repository's environment costs: per command once built (target: p50 under 5 ms above
the same sandboxed command without it), its first build, and 20 agents starting together on one
new key (it is built once).

1. `true` in the sandbox, alternately without an environment and with a built one mounted
   (the read-only bind at /run/env, its PATH and variables), the way the shell tool runs it;
   p50 / p90 of each and the difference.
2. The first build of a declaration making a virtualenv from the system's Python (offline).
3. 20 threads ask for a new key at the same moment (`environment_ensure`, as verification and
   the build task do); the setup appends to a file in the environment, so the number of lines
   is the number of builds.

    DATABASE_URL=... python bench/environments.py [--runs 200]
Uses a database of its own (annihilation_bench) on the dev Postgres; the repository, worktree
and environments live in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, scratch_dir  # noqa: E402

HOME = scratch_dir("annihilation-env-bench-")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ["ANNIHILATION_ENV_DECLARATION"] = ""
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
django_bench_db()

from django.db import connections  # noqa: E402

from core.cli import positive_int  # noqa: E402
from psychonauts.containment import sandbox  # noqa: E402
from psychonauts.environments.models import EnvironmentBuild  # noqa: E402
from psychonauts.environments.services import Environment, environment_ensure  # noqa: E402
from psychonauts.environments.spec import DECLARATION_PATH  # noqa: E402
from psychonauts.workspaces.git import git  # noqa: E402
from psychonauts.workspaces.worktrees import demo_repo_ensure, workspace_ensure  # noqa: E402

QUANTUM = 1
AGENTS = 20


def _declare(repo: Path, text: str) -> None:
    path = repo / DECLARATION_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "environment", cwd=repo)


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=200, help="runs of each (default 200)")
    runs = parser.parse_args().runs
    EnvironmentBuild.objects.all().delete()
    repo = demo_repo_ensure(HOME / "repo")
    status = sandbox.sandbox_status()
    if status.state != "on":
        sys.exit(f"the sandbox is {status.describe()}: nothing to measure")
    print(f"sandbox: {status.describe()}")

    _declare(repo, "setup: ['python3 -m venv /run/env/venv']\npath: [venv/bin]\nnetwork: []\n")
    started = time.perf_counter()
    built = environment_ensure(repo)
    first_build = time.perf_counter() - started
    assert built is not None
    print(f"first build (python3 -m venv, offline): {first_build:.2f} s")

    worktree = workspace_ensure(quantum_id=QUANTUM)
    mount = built.mount()
    bare: list[float] = []
    with_env: list[float] = []
    for _ in range(runs):
        for into, environment in ((bare, None), (with_env, mount)):
            began = time.perf_counter()
            result = sandbox.sandbox_run(
                "true", workspace=worktree, quantum_id=QUANTUM, timeout_s=30,
                environment=environment,
            )  # fmt: skip
            into.append((time.perf_counter() - began) * 1000)
            assert result.returncode == 0, result.output
    print(f"`true`, {runs} runs each  p50 ms  p90 ms")
    print(f"  sandbox              {_p(bare, 50):6.2f}  {_p(bare, 90):6.2f}")
    print(f"  sandbox + env        {_p(with_env, 50):6.2f}  {_p(with_env, 90):6.2f}")
    print(f"  added by the env     {_p(with_env, 50) - _p(bare, 50):6.2f}  (target < 5 ms p50)")

    _declare(repo, "setup: ['echo built >> /run/env/builds', 'sleep 1']\nnetwork: []\n")
    got: list[Environment | None] = []
    gate = threading.Barrier(AGENTS)

    def agent() -> None:
        try:
            gate.wait()
            got.append(environment_ensure(repo))
        finally:
            connections.close_all()

    began = time.perf_counter()
    threads = [threading.Thread(target=agent) for _ in range(AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    keys = {e.key for e in got if e is not None}
    assert len(got) == AGENTS and len(keys) == 1, (len(got), keys)
    builds = (Path(next(iter(got)).folder) / "builds").read_text().count("built")  # type: ignore[union-attr]
    print(
        f"{AGENTS} agents at once on a new key: {builds} build(s), "
        f"{EnvironmentBuild.objects.filter(key__in=keys).count()} row, all ready in {elapsed:.2f} s"
    )


if __name__ == "__main__":
    main()
