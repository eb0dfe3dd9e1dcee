"""What the agent sandbox adds to one shell command (target: p50 under 15 ms above the same
command run without it).

Each command runs the way the shell tool runs it (`bash -c`, the agent's environment, the
resource limits, output captured), alternately in the sandbox (bubblewrap: namespaces, mounts,
an unprivileged uid when run as root) and without it (ANNIHILATION_SANDBOX=off's path), in a
git worktree of a small repository. Prints p50 / p90 wall time of each, the difference and the
ratio. (No CPU figure: the sandboxed processes are reaped inside their PID namespace, so the
CPU they spend is not reported back to this process the way a plain child's is.)

    python bench/sandbox_overhead.py [--runs 200]
Each sandboxed command includes the watchdog (memory of its processes and /tmp sampled, its
worktree walked before, during and after it). Needs the dev Postgres (DATABASE_URL: a root
worker's sandbox uids are rows there; a database of its own is made), no Redis; the repository
and its worktree live in a temporary folder (in RAM where the machine has /dev/shm).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, filesystem, scratch_dir  # noqa: E402

HOME = scratch_dir("annihilation-sandbox-bench-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # a strong one: DEBUG is off

django_bench_db("annihilation_bench_sandbox")

from django.conf import settings  # noqa: E402

from core.cli import positive_int  # noqa: E402
from psychonauts.containment import sandbox  # noqa: E402
from psychonauts.workspaces.worktrees import demo_repo_ensure, workspace_ensure  # noqa: E402

COMMANDS = {
    "true": "true",
    "ls": "ls -la",
    "git status": "git status --short",
    "python3": "python3 -c pass",
}
QUANTUM = 1


def _timed(run: Callable[[], sandbox.SandboxResult], count: int) -> list[float]:
    walls = []
    for _ in range(count):
        started = time.perf_counter()
        result = run()
        walls.append((time.perf_counter() - started) * 1000)
        assert result.returncode == 0, result.output
    return walls


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=200, help="runs of each (default 200)")
    runs = parser.parse_args().runs
    demo_repo_ensure(Path(settings.ANNIHILATION_REPO))
    worktree = workspace_ensure(quantum_id=QUANTUM)
    status = sandbox.sandbox_status()
    if status.state != "on":
        sys.exit(f"the sandbox is {status.describe()}: nothing to measure")
    print(f"sandbox: {status.describe()}")
    print(f"worktree on {filesystem(worktree)}; {runs} runs of each, interleaved")
    environment = sandbox._environment(worktree, {})

    def plain(command: str) -> sandbox.SandboxResult:
        return sandbox._execute(
            sandbox.shell_argv(command, 30), cwd=worktree, env=environment,
            timeout_s=30, sandboxed=False,
        )  # fmt: skip

    def boxed(command: str) -> sandbox.SandboxResult:
        return sandbox.sandbox_run(command, workspace=worktree, quantum_id=QUANTUM, timeout_s=30)

    print(f"{'command':<12} {'plain p50':>10} {'p90':>7} {'sandbox p50':>12} {'p90':>7} "
          f"{'+p50 ms':>8} {'ratio':>6}")  # fmt: skip
    worst = 0.0
    for name, command in COMMANDS.items():
        plain_ms: list[float] = []
        boxed_ms: list[float] = []
        # Interleaved in rounds, so a change in the machine's load falls on both alike.
        for _ in range(10):
            plain_ms += _timed(lambda c=command: plain(c), max(1, runs // 10))  # type: ignore[misc]
            boxed_ms += _timed(lambda c=command: boxed(c), max(1, runs // 10))  # type: ignore[misc]
        p50, b50 = _p(plain_ms, 50), _p(boxed_ms, 50)
        worst = max(worst, b50 - p50)
        print(f"{name:<12} {p50:>8.2f}ms {_p(plain_ms, 90):>5.1f}ms {b50:>10.2f}ms "
              f"{_p(boxed_ms, 90):>5.1f}ms {b50 - p50:>8.2f} {b50 / p50:>5.2f}x")  # fmt: skip
    verdict = "under" if worst < 15 else "OVER"
    print(f"largest p50 overhead: {worst:.2f} ms ({verdict} the 15 ms target)")


if __name__ == "__main__":
    main()
