"""What our control plane adds to an agent CLI (target: < 300 ms per run, < 5 ms per model call
through the gateway).

- Per model call: the same streamed request to the fake Messages API, alternately straight and
  through the model gateway (its unix socket, the allow-list, the budget check, the usage row
  and the run's counters); p50 / p95 of each and the difference.
- Per run: the real Claude Code binary doing the same scripted task (write a file, answer),
  alternately on its own (no sandbox, straight to the fake, a fresh state folder) and as a
  `claude-code` agent run (`agent_run_execute`: claim, sandbox, gateway, events, commit)
  after the worker's warm-up; p50 / p95 of each and the difference, the first round of each
  not counted (the CLI's and the process's first start).

- Start-up: where the time between the CLI's start and its first output goes. The sandbox
  alone (bubblewrap running `true`, with the sandbox's mounts), then Claude Code from its start
  to its first stream line (`system/init`, printed before any model call), four ways: on its
  own, under our shell limits (`ulimit`), in bubblewrap with the executor's mounts, and both (as
  the executor runs it).

    python bench/cli_executor.py [--calls 200] [--runs 5] [--startup 5]

Uses the dev services (make services) with a database of its own (annihilation_bench_cli). The
per-run part needs Claude Code installed (`make cli-agents`, or PSYCHONAUTS_CLI_AGENTS_DIR).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, pct, scratch_dir  # noqa: E402

HOME = scratch_dir("annihilation-cli-bench-")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ["ANNIHILATION_TRIVIAL_NO_LLM"] = "false"
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
django_bench_db("annihilation_bench_cli")

from core.cli import positive_int  # noqa: E402
from tests.fakes.anthropic_server import FakeReply, fake_anthropic_server  # noqa: E402
from tests.fakes.claude_code_script import claude_code_script  # noqa: E402

MODEL = "claude-bench-1"
BODY = {
    "model": MODEL,
    "max_tokens": 10,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def _post(conn: http.client.HTTPConnection) -> None:
    conn.request(
        "POST", "/v1/messages", body=json.dumps(BODY), headers={"content-type": "application/json"}
    )
    response = conn.getresponse()
    response.read()
    conn.close()


def _unix(path: Path) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(path))
    return conn


def per_call(calls: int) -> None:
    from bursts.models import AgentRun
    from psychonauts.executors.gateway import Gateway
    from quanta.services import quantum_create

    quantum = quantum_create(title="bench gateway")
    run = AgentRun.objects.create(agent_id=f"{quantum.pk}_bench", quantum=quantum, role="coder")
    direct: list[float] = []
    through: list[float] = []
    with fake_anthropic_server(lambda body: FakeReply(text="hello")) as fake:
        os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
        port = int(fake.base_url.rsplit(":", 1)[1])
        with Gateway(
            run, provider="claude-code", allowed_models=frozenset({MODEL}), wave=None
        ) as gw:
            for _ in range(calls):
                started = time.perf_counter()
                _post(http.client.HTTPConnection("127.0.0.1", port))
                direct.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                _post(_unix(gw.socket))
                through.append((time.perf_counter() - started) * 1000)
            assert gw.metered.calls == calls, gw.metered
    _report("model call", "ms", direct, through)


def per_run(runs: int) -> None:
    from psychonauts.executors.base import claude_binary
    from psychonauts.models import Role
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.runtime.execute import agent_run_execute
    from psychonauts.runtime.runs import agent_run_create
    from psychonauts.runtime.warmup import agents_warm_up
    from psychonauts.workspaces.worktrees import demo_repo_ensure
    from quanta.services import quantum_create

    binary = claude_binary()
    if not binary.is_file():
        print(f"per run: skipped, Claude Code is not installed ({binary})")
        return
    demo_repo_ensure(HOME / "repo")
    roles_sync_defaults()
    Role.objects.filter(name="coder").update(
        executor="claude-code", provider="anthropic", model=MODEL
    )
    steps = [
        FakeReply(tool_uses=[("Write", {"file_path": "bench.txt", "content": "bench\n"})]),
        FakeReply(text="Done."),
    ]
    agents_warm_up(1)  # what a worker does before its first task
    alone: list[float] = []
    ours: list[float] = []
    with fake_anthropic_server(claude_code_script(steps)) as fake:
        os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
        os.environ["ANTHROPIC_API_KEY"] = "bench"
        for number in range(runs + 1):  # the first round of each is a warm-up, not counted
            with tempfile.TemporaryDirectory(dir=HOME) as folder:
                work = Path(folder) / "work"
                work.mkdir()
                env = {
                    "PATH": os.environ["PATH"], "HOME": folder, "CLAUDE_CONFIG_DIR": f"{folder}/state",
                    "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "bench",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
                }  # fmt: skip
                started = time.perf_counter()
                done = subprocess.run(
                    [str(binary), "-p", "write bench.txt", "--output-format", "stream-json",
                     "--verbose", "--model", MODEL, "--setting-sources", "", "--strict-mcp-config",
                     "--permission-mode", "acceptEdits", "--allowedTools", "Write"],
                    cwd=work, env=env, capture_output=True, check=False,
                )  # fmt: skip
                if number:
                    alone.append(time.perf_counter() - started)
                if done.returncode != 0 or not (work / "bench.txt").exists():
                    raise SystemExit(f"the CLI alone failed: {done.stderr.decode()[-500:]}")
            quantum = quantum_create(title=f"bench run {number}")
            run = agent_run_create(quantum_id=quantum.pk, role="coder")
            started = time.perf_counter()
            outcome = agent_run_execute(agent_run_id=run.pk)
            if number:
                ours.append(time.perf_counter() - started)
            if outcome.status != "done":
                raise SystemExit(f"the agent run failed: {outcome.error}")
    _report("agent run", "s", alone, ours)


def startup(runs: int) -> None:
    import shlex

    from psychonauts.containment.sandbox import _boxed, _environment, shell_argv
    from psychonauts.executors.base import claude_binary

    binary = claude_binary()
    if not binary.is_file():
        print(f"start-up: skipped, Claude Code is not installed ({binary})")
        return
    install = binary.parents[4]
    work = Path(tempfile.mkdtemp(dir=HOME))
    state = Path(tempfile.mkdtemp(dir=HOME))
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    for folder in (work, state):
        folder.chmod(0o777)
    inside = Path("/tmp/.cli")
    env = {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": "bench",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
    }  # fmt: skip

    def argv(cli: Path) -> list[str]:
        return [str(cli), "-p", "hi", "--output-format", "stream-json", "--verbose", "--model",
                MODEL, "--setting-sources", "", "--strict-mcp-config", "--tools", "Read"]  # fmt: skip

    def first_line(command: list[str], environment: dict[str, str]) -> float:
        started = time.perf_counter()
        proc = subprocess.Popen(
            command, cwd=work, env=environment, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        took = time.perf_counter() - started
        os.killpg(proc.pid, 9)
        proc.wait()
        proc.stdout.close()
        if not line.startswith(b"{"):
            raise SystemExit(f"the CLI printed no stream line: {line[:200]!r}")
        return took

    def outside(limits: bool) -> float:
        command = argv(binary)
        if limits:
            command = shell_argv("exec " + shlex.join(command), 600)
        return first_line(command, _environment(work, {**env, "CLAUDE_CONFIG_DIR": str(state)}))

    def boxed(limits: bool) -> float:
        command = argv(inside / "install" / binary.relative_to(install))
        if limits:
            command = shell_argv("exec " + shlex.join(command), 600)
        # The sandbox's mounts as the executor has them (as the worker's own user here).
        full = _boxed(command, work, None, None)
        at = full.index("--unshare-ipc")
        full[at:at] = [
            "--perms", "0755", "--dir", str(inside),
            "--ro-bind", str(install), str(inside / "install"),
            "--bind", str(state), str(inside / "state"),
        ]  # fmt: skip
        environment = _environment(
            Path("/tmp"), {**env, "CLAUDE_CONFIG_DIR": str(inside / "state")}
        )
        return first_line(full, environment)

    def bwrap_true() -> float:
        started = time.perf_counter()
        subprocess.run(
            _boxed(["true"], work, None, None), env=_environment(Path("/tmp"), {}), check=True
        )
        return time.perf_counter() - started

    ways = [
        ("sandbox alone (bwrap true)", bwrap_true),
        ("CLI to first line, on its own", lambda: outside(False)),
        ("CLI to first line, our limits", lambda: outside(True)),
        ("CLI to first line, in bwrap", lambda: boxed(False)),
        ("CLI to first line, bwrap + limits (executor)", lambda: boxed(True)),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in ways}
    for _ in range(runs):  # interleaved: a busy machine's swings fall on every way alike
        for name, way in ways:
            times[name].append(way())
    load = os.getloadavg()[0]
    print(f"start-up ({runs} each, ms, load {load:.1f}):")
    for name, values in times.items():
        print(f"  {name:46s} p50 {pct(values, 50) * 1000:7.0f}  p95 {pct(values, 95) * 1000:7.0f}")


def _report(what: str, unit: str, alone: list[float], ours: list[float]) -> None:
    fmt = (lambda v: f"{v:.3f}") if unit == "s" else (lambda v: f"{v:.2f}")
    print(f"{what} ({len(alone)} each, {unit}): alone p50 {fmt(pct(alone, 50))} p95 "
          f"{fmt(pct(alone, 95))}; ours p50 {fmt(pct(ours, 50))} p95 {fmt(pct(ours, 95))}; "
          f"added p50 {fmt(pct(ours, 50) - pct(alone, 50))} p95 "
          f"{fmt(pct(ours, 95) - pct(alone, 95))}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=200)
    parser.add_argument("--runs", type=positive_int, default=5)
    parser.add_argument("--startup", type=positive_int, default=5)
    parser.add_argument("--only", choices=("calls", "runs", "startup"), default=None)
    args = parser.parse_args()
    if args.only in (None, "calls"):
        per_call(args.calls)
    if args.only in (None, "runs"):
        per_run(args.runs)
    if args.only in (None, "startup"):
        startup(args.startup)


if __name__ == "__main__":
    main()
