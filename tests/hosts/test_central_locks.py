"""Locks across hosts (core.locks): owner-only release, renewal, fencing tokens, and waiting
through a Redis restart (a private redis-server of the test, stopped and started again)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from core.locks import LockUnavailable, RedisLock
from core.redis import get_redis
from psychonauts.workspaces.central import Fence, fence_take
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from tests.hosts.conftest import Central, Host

MakeHost = Callable[[str, Central], Host]
# A root worker's sandbox uids are rows of the database, read from the hosts' threads too.
pytestmark = pytest.mark.django_db(transaction=True)


def test_it_is_released_only_by_its_holder_and_each_holder_has_a_larger_fencing_token(
    redis_client: redis.Redis,
) -> None:
    first = RedisLock("t:one", ttl_s=5, wait_s=0)
    assert first.acquire()
    second = RedisLock("t:one", ttl_s=5, wait_s=0)
    assert not second.acquire()
    second.release()  # not its holder: nothing happens
    assert redis_client.get("locks:t:one") == first.token
    first.release()
    with RedisLock("t:one", ttl_s=5, wait_s=0) as third:
        assert third.held and third.fencing > first.fencing


def test_a_holder_keeps_it_past_its_ttl_while_held(redis_client: redis.Redis) -> None:
    with RedisLock("t:long", ttl_s=0.3, wait_s=0) as lock:
        time.sleep(1.0)
        assert not RedisLock("t:long", ttl_s=0.3, wait_s=0).acquire()
        assert not lock.lost
    assert redis_client.get("locks:t:long") is None


def test_a_waiter_gets_it_when_the_holder_lets_go(redis_client: redis.Redis) -> None:
    holder = RedisLock("t:wait", ttl_s=5, wait_s=0)
    holder.acquire()
    threading.Timer(0.3, holder.release).start()
    started = time.monotonic()
    with RedisLock("t:wait", ttl_s=5, wait_s=5):
        assert 0.25 < time.monotonic() - started < 3


class PrivateRedis:
    """A redis-server of the test's own, on a free port, that the test stops and starts."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_redis(hosts_settings: Any, tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server to restart")
    server = PrivateRedis(tmp_path)
    server.start()
    hosts_settings.REDIS_URL = server.url
    get_redis.cache_clear()
    yield server
    server.stop()
    get_redis.cache_clear()


def test_it_waits_through_a_redis_restart_and_gives_up_after_its_wait(
    private_redis: PrivateRedis,
) -> None:
    private_redis.stop()
    threading.Timer(1.0, private_redis.start).start()
    started = time.monotonic()
    with RedisLock("t:restart", ttl_s=5, wait_s=15) as lock:
        assert lock.held and time.monotonic() - started >= 0.9
    private_redis.stop()
    with pytest.raises(LockUnavailable, match="Redis unavailable"):
        RedisLock("t:restart", ttl_s=5, wait_s=0.5).acquire()


def test_an_agent_commit_lands_through_a_redis_restart(
    private_redis: PrivateRedis, make_host: MakeHost, file_central: Central
) -> None:
    a = make_host("a", file_central)
    with a.active():
        fence = Fence("q12-coder")
        fence_take(fence)
        tree = workspace_ensure(quantum_id=12)
        (tree / "x.txt").write_text("x\n")
        private_redis.stop()  # Redis restarts while the agent ends
        threading.Timer(1.5, private_redis.start).start()
        sha = workspace_commit(
            workspace=tree, quantum_id=12, agent_id="q12-coder", role="coder", fence=fence
        )
    assert file_central.tip(branch_for(12)) == sha
