"""The Celery application every app sends its tasks with; its configuration is the Django
settings' CELERY_* names. Workers start it as `celery -A annihilation worker`."""

from __future__ import annotations

import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from celery import Celery
from celery.app.backends import by_url
from celery.backends.redis import RedisBackend
from celery.concurrency import get_implementation
from celery.result import GroupResult
from celery.signals import task_postrun, worker_init, worker_process_init, worker_ready
from django.db import connections
from psycopg_pool import PoolTimeout

from core import (
    warmups,
    workers,  # noqa: F401  (its receivers note each worker's host in Redis)
)
from core.redis import get_redis

logger = logging.getLogger(__name__)


class ResultBackend(RedisBackend):
    """Celery's Redis result backend, except that sending a chord keeps nothing of its header.

    To find out whether a chord's header holds groups (their layout must then be saved for the
    join), Celery's `apply_chord` builds a GroupResult of the header's results, and building one
    registers each as a result this process waits for: held strongly, its result channel
    subscribed, until its state message is read. A worker never reads that channel, so each
    fan-out stage a worker sent left three results and three subscriptions in it for the rest
    of its life. The header is looked into here without that; the join reads Redis, not these.
    """

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        results = header_result_args[1]
        # Only a header holding groups has a layout to save. A lazy header (a generator) is left
        # to Celery, which saves nothing for it either.
        if not isinstance(results, list) or any(isinstance(r, GroupResult) for r in results):
            super().apply_chord(header_result_args, body, **kwargs)


class Annihilation(Celery):
    """Tasks sent by name (`send_task`) are fire-and-forget unless the caller asks otherwise:
    with a Redis result backend, Celery would otherwise subscribe the sending process to each
    task's result channel, for good, outside a worker (a round trip per send, and a web process
    subscribed to every agent it ever resumed). A task object's own `ignore_result` still
    decides for `delay` and `apply_async`, and for the chords' headers."""

    def send_task(self, name: str, *args: Any, **options: Any) -> Any:
        options.setdefault("ignore_result", True)
        return super().send_task(name, *args, **options)

    def _get_backend(self) -> Any:
        """`ResultBackend` in place of Celery's plain Redis one; another backend is kept. (The
        setting is a URL, whose scheme picks Celery's class: this is where Celery builds it.)"""
        found: tuple[Any, str | None] = by_url(  # type: ignore[assignment]  # the stubs are wrong
            self.backend_cls or self.conf.result_backend, self.loader
        )
        backend, url = found
        if backend is RedisBackend:
            backend = ResultBackend
        return backend(app=self, url=url)


app = Annihilation("annihilation")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_postrun.connect
def _drop_broken_connections(**_: Any) -> None:
    """Workers reuse their database connection across tasks (CELERY_DB_REUSE_MAX); one that
    saw an error and no longer answers (Postgres restarted) is closed so the next task opens a
    fresh one instead of failing. Django's own check would also close a healthy one (max age 0)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


# A threads worker runs a hundred agents in one process: every collection holds the GIL for
# all of them. Python's default (700, 10, 10) ran ~600 young and 5 full collections per 200
# agents of bench/agents_concurrency.py, 0.76 s of CPU (the full ones ~0.1 s each); these
# thresholds ran 20 young ones, 0.10 s. Garbage in cycles is still collected, later.
WORKER_GC_THRESHOLDS = (20_000, 20, 20)


@worker_init.connect
@worker_process_init.connect
def _fewer_collections(**_: Any) -> None:
    gc.set_threshold(*WORKER_GC_THRESHOLDS)


# --- warming up a threads worker ------------------------------------------------------------
#
# A threads worker's first tasks would each pay, all at once and under one GIL, for what the
# process then keeps: a thread each, started by the consumer's own thread, which waits for every
# new thread to run (and a hundred busy ones hold the GIL); the database pool growing one
# connection at a time from its min_size while every thread waits for one; a Redis connection
# per thread; and whatever the apps make once per process (`core.warmups`). The
# worker makes them before it takes its first task.


def pool_threads_start(executor: ThreadPoolExecutor, count: int) -> int:
    """Start the executor's threads up to `count` now; returns how many it has. It starts a
    thread only for work that finds none idle, so each is given a job that waits until all
    are running."""
    release = threading.Event()
    jobs = [executor.submit(release.wait) for _ in range(count)]
    release.set()
    wait(jobs)
    return len(executor._threads)  # no public count; Celery's own pool info reads it too


def database_pools_fill(concurrency: int) -> int:
    """Open each pooled database's connections up to `concurrency` (at most its max_size) and
    hand them back idle; returns how many its pools hold. Unpooled databases are left alone
    (each thread opens its own)."""
    opened = 0
    for alias in connections:
        pool = getattr(connections[alias], "pool", None)
        if pool is None:
            continue
        pool.open(wait=True, timeout=10)
        stats = pool.get_stats()
        in_use = stats["pool_size"] - stats["pool_available"]
        taken = []
        try:
            # Taken together, so that the pool grows rather than handing back the same one.
            for _ in range(min(concurrency, pool.max_size) - in_use):
                taken.append(pool.getconn(timeout=10))
        except PoolTimeout:
            logger.warning("worker warm-up: the %s pool stopped growing", alias, exc_info=True)
        finally:
            for conn in taken:
                pool.putconn(conn)
        opened += pool.get_stats()["pool_size"]
    return opened


def redis_pool_fill(concurrency: int) -> int:
    """Open `concurrency` connections in the process's Redis pool (`get_redis`) and hand them
    back idle; returns how many are open."""
    pool = get_redis().connection_pool
    taken = []
    try:
        for _ in range(concurrency):
            taken.append(pool.get_connection())
    finally:
        for conn in taken:
            pool.release(conn)
    return len(taken)


def worker_warm_up(concurrency: int) -> None:
    """Run every warm-up for a worker of `concurrency` threads. One that fails is logged and
    skipped: the tasks will make what it did not, as they would without it."""
    for warmup in (database_pools_fill, redis_pool_fill, *warmups.WARMUPS):
        started = time.monotonic()
        try:
            warmup(concurrency)
        except Exception:
            logger.warning("worker warm-up %s failed", warmup.__qualname__, exc_info=True)
            continue
        logger.info(
            "worker warm-up %s took %.3f s",
            warmup.__qualname__,
            time.monotonic() - started,
            extra={"warmup": warmup.__qualname__, "concurrency": concurrency},
        )


@worker_ready.connect
def _warm_up_threads(sender: Any, **_: Any) -> None:
    """A threads worker warms up (`worker_warm_up`) before its event loop takes a message."""
    controller = getattr(sender, "controller", None)
    if controller is None or controller.pool_cls is not get_implementation("threads"):
        return
    concurrency = int(controller.concurrency)
    started = time.monotonic()
    threads = pool_threads_start(controller.pool.executor, concurrency)
    logger.info("worker warm-up: %d threads started in %.3f s", threads, time.monotonic() - started)
    worker_warm_up(concurrency)
