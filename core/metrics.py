"""The metrics every process counts (Prometheus); served at /metrics by the operations app.

Web, workers and beat are separate processes: each writes its counters and histograms to
memory-mapped files of its own under settings.METRICS_DIR (prometheus-client's multiprocess
mode) and /metrics adds them up. Figures that are a state rather than a count (queue depth,
agents by status, endpoint health) are read from the database and Redis at scrape time by the
operations app and passed to `exposition` as collectors.

The directory must be known before prometheus-client creates its first value, hence the
environment variable set below before the library's metric classes are used. The files of a
process that died stay behind: `files_compact` folds its counters and histograms into one
archive file per type (the totals never go back) and deletes its gauges.
"""

from __future__ import annotations

import fcntl
import functools
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from django.conf import settings


def metrics_dir() -> Path:
    return Path(settings.METRICS_DIR)


def _multiprocess_setup() -> None:
    path = metrics_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


_multiprocess_setup()

# After the environment names the directory: the library picks its value class from it.
from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.mmap_dict import MmapedDict  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

# A library imported before this module (Flower's, say) may have made the library choose
# in-process values already: choose again, now that the directory is set.
if values.ValueClass is values.MutexValue:
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]

P = ParamSpec("P")
R = TypeVar("R")

CONTENT_TYPE = CONTENT_TYPE_LATEST

VALIDATION_FAILURES = Counter(
    "annihilation_validation_failures_total",
    "Input refused at an entry point (CLI, web form, API, webhook, model output), by entry.",
    ["entry"],
)
AGENT_STAGE_SECONDS = Histogram(
    "annihilation_agent_stage_seconds",
    "How long one execution of an agent in its pipeline stage took, by outcome.",
    ["status"],
    buckets=(0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
)
TOKENS = Counter(
    "annihilation_tokens_total",
    "Model tokens used, by provider, model and direction (in, out).",
    ["provider", "model", "direction"],
)
PROMPT_TOKENS = Counter(
    "annihilation_prompt_tokens_total",
    "Model input tokens, all of them (read from no cache, read from the provider's prompt "
    "cache, or written to it), by provider and model.",
    ["provider", "model"],
)
CACHE_READ_TOKENS = Counter(
    "annihilation_cache_read_tokens_total",
    "Model input tokens read from the provider's prompt cache, by provider and model: over "
    "annihilation_prompt_tokens_total, the cache hit ratio.",
    ["provider", "model"],
)
COST = Counter(
    "annihilation_cost_usd_total",
    "What the model calls cost (USD), by provider and model.",
    ["provider", "model"],
)
ERRORS = Counter(
    "annihilation_errors_total",
    "Errors, by kind: agent (an execution ended in error), provider (a model endpoint failed "
    "after its retries), task (a Celery task failed).",
    ["kind"],
)
TETHER_WAIT_SECONDS = Histogram(
    "annihilation_tether_wait_seconds",
    "How long a question to the Tether waited, by how it ended: answered, or timed_out (the "
    "agent went on on its assumption, a drift). Questions still waiting are the "
    "annihilation_tether_oldest_wait_seconds gauge.",
    ["outcome"],
    buckets=(1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 86400),
)
WAVE_SECONDS = Histogram(
    "annihilation_wave_duration_seconds",
    "How long a wave ran, from start to its end, by final status.",
    ["status"],
    buckets=(1, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600, 86400),
)


# --- hooks: one call where the event happens ----------------------------------------------


def validation_failed(entry: str) -> None:
    """Count one refused input at `entry` (e.g. "api", "webhook", "cli", "form")."""
    VALIDATION_FAILURES.labels(entry=entry).inc()


def error(kind: str) -> None:
    ERRORS.labels(kind=kind).inc()


def usage_recorded(
    *,
    provider: str,
    model: str,
    tokens_in: int,
    tokens_out: int,
    cost_usd: Any,
    cache_read: int = 0,
    cache_write: int = 0,
) -> None:
    """One model call's usage (cost as a Decimal or a float; `tokens_in` those read from no
    cache and written to none)."""
    PROMPT_TOKENS.labels(provider=provider, model=model).inc(tokens_in + cache_read + cache_write)
    if cache_read:
        CACHE_READ_TOKENS.labels(provider=provider, model=model).inc(cache_read)
    TOKENS.labels(provider=provider, model=model, direction="in").inc(tokens_in)
    TOKENS.labels(provider=provider, model=model, direction="out").inc(tokens_out)
    COST.labels(provider=provider, model=model).inc(float(cost_usd))


def tether_waited(waited_s: float, *, outcome: str) -> None:
    """A question's wait ended: `answered` or `timed_out`."""
    TETHER_WAIT_SECONDS.labels(outcome=outcome).observe(max(waited_s, 0.0))


def wave_finished(*, status: str, seconds: float) -> None:
    WAVE_SECONDS.labels(status=status).observe(max(seconds, 0.0))


class _HasStatus(Protocol):
    @property
    def status(self) -> str: ...


S = TypeVar("S", bound=_HasStatus)


def timed_execution(func: Callable[P, S]) -> Callable[P, S]:
    """Decorates the function that runs one agent execution to an outcome (anything with a
    `status`): its duration by outcome, and an error counted when it ended in one."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> S:
        started = time.monotonic()
        outcome = func(*args, **kwargs)
        AGENT_STAGE_SECONDS.labels(status=outcome.status).observe(time.monotonic() - started)
        if outcome.status == "error":
            error("agent")
        return outcome

    return wrapper


# --- exposition ---------------------------------------------------------------------------


def exposition(collectors: Iterable[Collector] = ()) -> bytes:
    """The Prometheus text format of every process's metrics plus `collectors` (read now)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir()))  # type: ignore[no-untyped-call]
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry)


def counter_totals() -> dict[str, float]:
    """Every counter's total over all processes and labels, by name (`..._total`)."""
    totals: dict[str, float] = {}
    for metric in MultiProcessCollector(None, path=str(metrics_dir())).collect():  # type: ignore[no-untyped-call]
        if metric.type != "counter":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def files_compact() -> int:
    """Fold the metric files of dead processes into the archives; returns how many were.

    Counters and histograms are added to `<type>_archive.db` (a total includes every process
    that ever counted); gauges of a dead process are deleted. One compaction at a time (a
    lock file): two would add a dead process twice."""
    path = metrics_dir()
    folded = 0
    with (path / ".compact.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        for f in sorted(path.glob("*.db")):
            typ, _, rest = f.name.removesuffix(".db").rpartition("_")
            if not rest.isdigit() or _alive(int(rest)):
                continue  # an archive, or a live process's file
            if not typ.startswith("gauge"):
                archive = MmapedDict(str(path / f"{typ}_archive.db"))  # type: ignore[no-untyped-call]
                try:
                    for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(f)):  # type: ignore[no-untyped-call]
                        archive.write_value(key, archive.read_value(key)[0] + value, timestamp)  # type: ignore[no-untyped-call]
                finally:
                    archive.close()  # type: ignore[no-untyped-call]
            f.unlink()
            folded += 1
    return folded
