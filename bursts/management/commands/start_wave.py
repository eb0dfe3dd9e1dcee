"""`manage.py start_wave [--label L]... [--continuous] [--follow] [--json]`.

With --follow it prints progress until the wave ends; the exit code then tells the outcome:
0 every run succeeded, 1 the wave ended but some runs failed, 2 the wave failed or was cancelled.

No silent waits: when no Celery worker answers (or none consumes the queue its tasks wait in)
it says so at once on stderr, with how to start one; --follow repeats the warning every
OPERATIONS_WARN_EVERY_S while work waits with nobody to do it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from bursts.errors import BurstsError
from bursts.hooks import WAVE_CHECKS
from bursts.models import WAVE_TERMINAL, RunStatus, WaveStatus
from bursts.selectors import WaveProgress, celery_queue_depths, wave_detail, wave_progress
from bursts.services import wave_start
from core.cli import SafeCommand, emit_json, positive_int, seconds
from core.workers import NO_WORKER_HINT, workers_consuming
from quanta.errors import InvalidQuantum
from quanta.fields import clean_label
from repos.errors import RepositoryError
from repos.selectors import repository_get


def wave_label(value: str) -> str:
    """An argparse type: a label as quanta carry them (the quanta's own check)."""
    try:
        return clean_label(value)
    except InvalidQuantum as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def progress_line(p: WaveProgress) -> str:
    def fmt(counts: dict[str, int]) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"

    return (
        f"wave {p['wave_id']} [{p['status']}] bursts={p['bursts']} | runs: {fmt(p['runs'])}"
        f" | agents: {fmt(p['agents'])} | stages: {fmt(p['stages'])}"
    )


def nobody_working() -> str | None:
    """Why nothing will run the waiting work (no worker answers, or none consumes a queue
    with tasks in it), or None when some worker is there to do it."""
    timeout = settings.OPERATIONS_PING_TIMEOUT_S
    # The first answer is usually enough (the worker consumes the queues with work): only
    # then are all the workers waited for.
    consumers = workers_consuming(timeout=timeout, limit=1)
    if not consumers:
        return (
            f"warning: no Celery worker answered within {timeout:g} s: nothing will run this "
            f"wave's agents until one does; {NO_WORKER_HINT}"
        )
    waiting = {name for name, n in celery_queue_depths().items() if n}
    if waiting - {q for queues in consumers.values() for q in queues}:
        consumers = workers_consuming(timeout=timeout) or consumers
    consumed = {q for queues in consumers.values() for q in queues}
    idle = sorted(waiting - consumed)
    if idle:
        return (
            f"warning: tasks wait in queue(s) {', '.join(idle)} that no worker consumes "
            f"(workers: {', '.join(sorted(consumers))}); {NO_WORKER_HINT}"
        )
    return None


def work_waits(p: WaveProgress) -> bool:
    return bool(p["agents"].get("pending")) or any(celery_queue_depths().values())


def follow(cmd: BaseCommand, wave_id: int, *, timeout: float | None, to_stderr: bool) -> str:
    """Print a line whenever progress changes, and the no-worker warning again every
    OPERATIONS_WARN_EVERY_S while work waits with nobody to do it; return the wave's final
    status."""
    out = cmd.stderr if to_stderr else cmd.stdout
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    checked = time.monotonic()
    while True:
        p = wave_progress(wave_id=wave_id)
        line = progress_line(p)
        if line != last:
            out.write(line)
            last = line
        if (
            time.monotonic() - checked >= settings.OPERATIONS_WARN_EVERY_S
            and p["status"] not in WAVE_TERMINAL
        ):
            checked = time.monotonic()
            warning = nobody_working() if work_waits(p) else None
            if warning:
                cmd.stderr.write(warning)
        if p["status"] in WAVE_TERMINAL:
            return p["status"]
        if deadline is not None and time.monotonic() > deadline:
            raise CommandError(f"wave {wave_id} still running after {timeout} s", returncode=3)
        time.sleep(0.25)


def exit_code(detail: dict[str, Any]) -> int:
    if detail["status"] != WaveStatus.DONE:
        return 2
    return 1 if any(r["status"] != RunStatus.DONE for r in detail["runs"]) else 0


def summary(cmd: BaseCommand, detail: dict[str, Any]) -> None:
    stats = detail["stats"]
    cmd.stdout.write(
        f"wave {detail['id']} {detail['status']}: {stats['bursts']} burst(s), "
        f"{stats['runs_total']} run(s), {stats['agents_total']} agent run(s), "
        f"{stats['duration_s']} s" + (f" — {detail['error']}" if detail["error"] else "")
    )
    for run in detail["runs"]:
        cmd.stdout.write(
            f"  burst {run['burst']} #{run['quantum_id']} {run['title']!r} via {run['pipeline']}: "
            f"{run['status']} (quantum {run['quantum_status']})"
            + (f" — {run['error']}" if run["error"] else "")
        )
        for agent in run["agents"]:
            text = " ".join((agent["result"] or agent["error"]).split())[:100]
            cmd.stdout.write(
                f"      {agent['agent_id']}#{agent['attempt']} {agent['status']}: {text}"
            )


class Command(SafeCommand):
    help = "Start a wave: bursts of ready quanta through their pipelines until nothing is ready."
    needs_redis = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--label",
            action="append",
            dest="labels",
            default=[],
            type=wave_label,
            metavar="LABEL",
            help="scope the wave to quanta with any of these labels (repeatable; default all)",
        )
        parser.add_argument(
            "--continuous",
            action="store_true",
            help="start newly unblocked quanta at once, without burst barriers",
        )
        parser.add_argument(
            "--max-bursts", type=positive_int, help="default: settings.WAVE_MAX_BURSTS"
        )
        parser.add_argument(
            "--follow", action="store_true", help="show progress until the wave ends"
        )
        parser.add_argument(
            "--timeout", type=seconds, help="with --follow: give up after this many seconds"
        )
        parser.add_argument(
            "--repository", metavar="NAME", help="whose ready quanta (default: the default one)"
        )
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = bool(options["json"])
        for check in WAVE_CHECKS:
            problem = check()
            if problem:
                self.stderr.write(problem)
        try:
            repository = options["repository"]
            wave = wave_start(
                repository_id=repository_get(name=repository).pk if repository else None,
                labels=options["labels"],
                continuous=bool(options["continuous"]),
                max_bursts=options["max_bursts"],
                started_by="cli",
            )
        except (BurstsError, RepositoryError) as exc:
            raise CommandError(str(exc)) from None
        if wave.status not in WAVE_TERMINAL:
            warning = nobody_working()
            if warning:
                self.stderr.write(warning)
        if not options["follow"]:
            if as_json:
                emit_json(self.stdout, {"wave_id": wave.pk, "status": wave.status})
            else:
                self.stdout.write(f"wave {wave.pk} started ({wave.status})")
            return
        follow(self, wave.pk, timeout=options["timeout"], to_stderr=as_json)
        detail = wave_detail(wave_id=wave.pk)
        if as_json:
            emit_json(self.stdout, detail)
        else:
            summary(self, detail)
        code = exit_code(detail)
        if code:
            raise CommandError(
                f"wave {wave.pk} {detail['status']}" + (" with failed runs" if code == 1 else ""),
                returncode=code,
            )
