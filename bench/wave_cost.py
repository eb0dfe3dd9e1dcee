"""Cost per closed quantum: a wave through the whole system against a fake Anthropic API that
caches prompts as the real one does, with prompt caching on and off.

The same wave is run twice on one Celery worker (threads pool) with the psychonauts executor and
the anthropic provider from its settings (ANTHROPIC_BASE_URL): once with the cache marks
(ANNIHILATION_PROMPT_CACHE=true, the default) and once without. Each wave closes `--quanta`
quanta of a repository whose modules the agents read, through a one-stage pipeline of the coder
role; each coder looks around for `--turns` turns (a file read each turn, ~2,500 characters sent
back) before its answer. The fake (tests/fakes/anthropic_server.py, `PromptCache`) reports the
usage the API would: input tokens read from cache, written to it, and neither. The figures are
the usage ledger's (psychonauts Usage rows, priced as the spend pages price them): tokens, the
share of input read from cache, and the cost per closed quantum. Target: with caching, at most a
third of the cost without.

    python bench/wave_cost.py [--quanta 20] [--turns 12]
Uses the dev services (make bench) with a database of its own (annihilation_bench_wave_cost,
migrated and emptied), a temporary ANNIHILATION_HOME (in RAM where the machine has /dev/shm)
and a Redis database of its own (number 7 of the dev Redis: its broker, slots and limits); the
demo's data is never touched.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, scratch_dir  # noqa: E402

HOME = scratch_dir("annihilation-bench-cost-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANNIHILATION_HOME"] = str(HOME)
os.environ["ANNIHILATION_REPO"] = str(HOME / "repo")
os.environ["ANTHROPIC_API_KEY"] = "bench"
os.environ["ANNIHILATION_BURSTS_EXECUTOR"] = "psychonauts"
os.environ["ANNIHILATION_PROVIDER"] = "anthropic"
os.environ["ANNIHILATION_TEXT_FLUSH_S"] = "0.5"
# The wave's tasks go to the default queue: on a Redis database of its own, no other worker
# (a developer's) takes them.
_redis = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/0"))
os.environ["REDIS_URL"] = urlunsplit(_redis._replace(path="/7"))
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))

django_bench_db("annihilation_bench_wave_cost")  # sets DATABASE_URL for the worker too

from django.conf import settings  # noqa: E402
from django.db.models import Count, Sum  # noqa: E402

from tests.fakes.anthropic_server import FakeReply, PromptCache, fake_anthropic_server  # noqa: E402

MODULES = 12


def repository(path: Path) -> None:
    """The demo repository with MODULES modules of ~2,500 characters each, committed."""
    from psychonauts.workspaces.worktrees import demo_repo_ensure

    demo_repo_ensure(path)
    for n in range(MODULES):
        lines = [f'"""Module {n}: the handlers of case family {n}."""', ""]
        for i in range(25):
            lines += [f"def handle_{n}_{i}(value):", f"    return value * {i} + {n}", ""]
        (path / f"module_{n}.py").write_text("\n".join(lines))
    git = ["git", "-C", str(path), "-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "modules"], check=True)


def coder(turns: int) -> Any:
    """Each agent reads one module a turn for `turns - 1` turns, then answers."""

    def reply(body: dict[str, Any]) -> FakeReply:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done < turns - 1:
            path = f"module_{done % MODULES}.py"
            return FakeReply(
                text=f"Reading {path} to see how it handles its cases.",
                tool_uses=[("read_file", {"path": path})],
                tokens_out=120,
            )
        return FakeReply(text="Every module handles its cases; nothing to change.", tokens_out=60)

    return reply


def start_worker(env: dict[str, str], concurrency: int) -> subprocess.Popen[bytes]:
    from annihilation.celery import app

    name = f"bench-cost-{os.getpid()}-{time.monotonic_ns()}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "annihilation", "worker", "--pool", "threads",
         "-c", str(concurrency), "--loglevel", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat", "-n", f"{name}@%h"],
        cwd=BASE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if app.control.ping(destination=[f"{name}@{os.uname().nodename}"], timeout=0.5):
            return worker
    worker.kill()
    raise SystemExit("the worker did not start")


@dataclass
class WaveCost:
    closed: int
    calls: int
    plain: int  # input tokens neither read from nor written to the cache
    read: int
    write: int
    output: int
    usd: Decimal
    seconds: float

    @property
    def input(self) -> int:
        return self.plain + self.read + self.write

    @property
    def per_quantum(self) -> Decimal:
        return self.usd / max(1, self.closed)


def wave(label: str, *, cached: bool, quanta: int, turns: int) -> WaveCost:
    from bursts.models import WAVE_TERMINAL, Wave
    from bursts.services import wave_start
    from psychonauts.models import Usage
    from quanta.models import Quantum, QuantumStatus
    from quanta.services import quantum_create

    with fake_anthropic_server(coder(turns), cache=PromptCache()) as fake:
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": fake.base_url,
            "ANNIHILATION_PROMPT_CACHE": "true" if cached else "false",
        }
        worker = start_worker(env, concurrency=quanta)
        try:
            for n in range(quanta):
                quantum_create(
                    title=f"Check that module {n % MODULES} handles every case (#{n})",
                    body=f"Read the modules and check that module {n % MODULES} handles "
                    "every case of its family; change nothing that works.",
                    labels=[label],
                    complexity="standard",
                )
            started = time.monotonic()
            made = wave_start(labels=[label], started_by="bench")
            while Wave.objects.get(pk=made.pk).status not in WAVE_TERMINAL:
                if time.monotonic() - started > 900:
                    raise SystemExit(f"wave {label} did not end within 15 minutes")
                time.sleep(0.5)
            seconds = time.monotonic() - started
        finally:
            worker.terminate()
            worker.wait()
    closed = Quantum.objects.filter(labels__contains=[label], status=QuantumStatus.CLOSED).count()
    totals = Usage.objects.filter(wave_id=made.pk).aggregate(
        calls=Count("pk"),
        plain=Sum("tokens_in"),
        read=Sum("cache_read_tokens"),
        write=Sum("cache_write_tokens"),
        write_long=Sum("cache_write_long_tokens"),
        output=Sum("tokens_out"),
        usd=Sum("cost_usd"),
    )
    return WaveCost(
        closed=closed,
        calls=totals["calls"] or 0,
        plain=totals["plain"] or 0,
        read=totals["read"] or 0,
        write=(totals["write"] or 0) + (totals["write_long"] or 0),
        output=totals["output"] or 0,
        usd=totals["usd"] or Decimal(0),
        seconds=seconds,
    )


def report(name: str, cost: WaveCost, quanta: int) -> None:
    share = cost.read / cost.input if cost.input else 0.0
    print(
        f"{name}: {cost.closed}/{quanta} quanta closed in {cost.seconds:.1f}s, "
        f"{cost.calls} model calls"
    )
    print(
        f"  input {cost.input:,} tokens: read from cache {cost.read:,} ({share:.1%}), "
        f"written {cost.write:,}, uncached {cost.plain:,}; output {cost.output:,}"
    )
    print(f"  cost ${cost.usd:.4f}; per closed quantum ${cost.per_quantum:.4f}")


def main() -> None:
    from core.cli import positive_int

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quanta", type=positive_int, default=20)
    parser.add_argument("--turns", type=positive_int, default=12)
    args = parser.parse_args()

    from psychonauts.roles import roles_sync_defaults
    from quanta.pipelines.services import pipelines_save

    roles_sync_defaults()
    repository(HOME / "repo")
    pipelines_save(
        specs=[
            (
                "bench",
                {
                    "name": "bench-coder",
                    "description": "one coder",
                    "match_labels": [],
                    "match_kinds": [],
                    "is_default": True,
                    "stages": [
                        {
                            "index": 0,
                            "name": "code",
                            "mode": "sequential",
                            "agents": [{"role": "coder", "settings": {}}],
                            "condition": "",
                            "retries": 0,
                            "timeout_s": 0,
                        }
                    ],
                },
            )
        ]
    )
    model = settings.PSYCHONAUTS_MODELS["standard"]
    print(
        f"{args.quanta} quanta, one coder each, {args.turns} turns; model {model} at its price; "
        "fake Messages API with the API's caching rules"
    )
    on = wave("cache-on", cached=True, quanta=args.quanta, turns=args.turns)
    off = wave("cache-off", cached=False, quanta=args.quanta, turns=args.turns)
    report("caching on", on, args.quanta)
    report("caching off", off, args.quanta)
    ratio = on.per_quantum / off.per_quantum if off.per_quantum else Decimal(0)
    print(f"cost per closed quantum with caching: {ratio:.1%} of without (target <= 33.3%)")
    sys.exit(0 if on.closed == off.closed == args.quanta and ratio <= Decimal(1) / 3 else 1)


if __name__ == "__main__":
    main()
